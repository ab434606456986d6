"""Calibration: fit an engine profile's efficiency parameters to real benchmark results.

- :mod:`recommender.calibrate.measurements`: the :class:`Measurement` row and the model's prediction of it;
- :mod:`recommender.calibrate.readers`: published-measurements CSV and ``vllm bench serve`` JSON readers;
- :mod:`recommender.calibrate.fit`: robust least squares, unconstrained-parameter detection, held-out error;
- :mod:`recommender.calibrate.report`: profile YAML (atomic write), text and JSON reports;
- :mod:`recommender.calibrate.api`: ``calibrate(CalibrateRequest)``, what ``recommend calibrate`` runs.

Submodules are imported on use (``fit`` needs scipy).
"""
