"""The calibration: the cost model's constants as one typed file (calibration.json), the published measurements
they are fitted and scored on (reference/), and the fit itself."""
