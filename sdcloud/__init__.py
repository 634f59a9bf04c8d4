"""sdcloud: Stable Diffusion training and batch generation on cloud GPUs for the least money."""

__version__ = "0.1.0"
