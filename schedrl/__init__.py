"""schedrl: RL post-training where every what-runs-when decision is an explicit scheduler."""

__version__ = "0.1.0"
