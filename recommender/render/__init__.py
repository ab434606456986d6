"""Renderers: pure functions from results to strings (text, JSON, YAML, CSV, SVG/HTML)."""
