"""Search: what the sweep knows before it measures (the prior: space and cost model) and how it proposes the next
layout (the searches by name, their Optuna samplers, the calibrated ranking)."""
