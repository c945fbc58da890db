"""Calibration of the cost models on operator-level measurements (never on serving results).

``aic_extract`` regenerates the shipped kernel tables (``sim/data/kernels/aiconfigurator``) from
aiconfigurator-core's measured database; ``kernels`` fits the element-wise coefficients on
Vidur's profiles, measures the fit and hold-out error of every table and writes the calibration
section of docs/cost_model.md.
"""
