"""The package version (one place: the CLI's --version and ``recommender.__version__`` read it; pyproject.toml
states the same number)."""

__version__ = "0.1.0"
