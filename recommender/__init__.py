"""recommender: plan LLM serving deployments from an analytic cost model."""

__version__ = "0.1.0"
