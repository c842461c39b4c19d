"""Learner side: batches, losses applied with an optimizer, schedules, checkpoints, supervised warm-up."""
