"""raysim: Ray-based simulation of federated learning on medical images."""

__version__ = "0.1.0"
