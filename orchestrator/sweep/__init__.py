"""The sweep: a session (stores, study, lease, MLflow), the loop (propose -> screen -> dispatch -> record),
the samplers, the prior (space and cost model) and the calibrated search."""

from orchestrator.sweep.loop import Sweep, SweepOutcome, run_sweep
from orchestrator.sweep.prior import Prediction, Prior, make_prior

__all__ = ["Prediction", "Prior", "Sweep", "SweepOutcome", "make_prior", "run_sweep"]
