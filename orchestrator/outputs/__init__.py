"""Outputs: what a finished sweep gives its user (check, export, report, the winner for promotion, calibration)."""
