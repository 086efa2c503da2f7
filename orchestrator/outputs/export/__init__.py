"""A Layout (+ model + sequence length) as something a production job can run, and back.

Three renderings of the same layout, one module each:
- megatron_lm.py, `megatron_args`: Megatron-LM `pretrain_gpt.py` flags (argv list; `megatron_args_text` one flag
  per line);
- bridge.py, `bridge_overrides`: Megatron-Bridge ConfigContainer overrides ({model,train,optimizer,ddp,dataset}.field);
- slurm.py, `sbatch_script`: a ready Slurm launch (torchrun per node under srun, running pretrain_gpt.py).
megatron_lm_reader.py, `layout_from_megatron_args`, parses the flags back to a Layout (round trip); layout_file.py,
`layout_yaml`, writes the layout.yaml `--layout FILE` reads. The Megatron-Core fields the renderings share are
layout_fields.py's (the layout's) and model_fields.py's (the model's layer kinds). This package's names are the
export API: each is imported here from the module that owns it.

Values are spelled as each dimension's declaration says (search_spaces.layouts.layout: `megatron_values`, ...). Every
flag, field name and value is checked against what consumes it: Megatron-LM's own argument parser and the
megatron-core 0.19.2 config dataclasses (tests/orchestrator/test_export.py), Megatron-Bridge's override loading and the
value sets Megatron-Core / Transformer Engine accept (tests/orchestrator/test_consumers.py). No torch or megatron
import here.
"""

from __future__ import annotations

from orchestrator.outputs.export.bridge import bridge_overrides, bridge_overrides_yaml
from orchestrator.outputs.export.layout_file import layout_yaml
from orchestrator.outputs.export.megatron_lm import layout_args, megatron_args, megatron_args_text, model_args
from orchestrator.outputs.export.megatron_lm_reader import layout_from_megatron_args
from orchestrator.outputs.export.model_fields import family_fields
from orchestrator.outputs.export.slurm import sbatch_script

__all__ = ["bridge_overrides", "bridge_overrides_yaml", "family_fields", "layout_args", "layout_from_megatron_args",
           "layout_yaml", "megatron_args", "megatron_args_text", "model_args", "sbatch_script"]
