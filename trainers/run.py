"""One profiling run on Megatron-Core: build the model for the layout, train a few steps, measure.

`run_trial` fills a TrialResult in place (on rank 0; other ranks return after the final gather).
Everything parallel is Megatron-Core's own: parallel_state groups, GPTModel with MoE layers and token
dispatchers, the 1F1B / interleaved schedules, DDP, the (distributed) optimizer.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from search_spaces import validation
from search_spaces.cost.flops import flops_per_step
from search_spaces.cost.packing import packed_flops_per_step, pad_multiple, statistics_for
from search_spaces.stopping import WILL_NOT_FIT

from trainers import config as trainer_config
from trainers import faults, measure, routing_load, step_watch
from trainers.packed_batches import PackedTokens


def _init_process_group(on_cpu: bool, timeout_s: float, max_connections: int = 1) -> torch.device:
    if not on_cpu:
        # Megatron-Core needs ordered kernel launches for TP/SP comm overlap, more queues for the EP overlap
        # (Layout.cuda_device_max_connections); set before the CUDA context.
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", str(max_connections))
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if dist.is_initialized():
        return device
    backend, timeout = "gloo" if on_cpu else "nccl", timedelta(seconds=timeout_s)
    if "MASTER_ADDR" not in os.environ:  # plain `python -m trainers.megatron_moe`: a world of one
        # An in-process store: no port to pick and then lose to another process before binding it.
        os.environ.update(RANK="0", WORLD_SIZE="1")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)
    return device


def _have_te() -> bool:
    try:
        import transformer_engine  # noqa: F401
        return True
    except ImportError:
        return False


def _build_config(model, layout, on_cpu: bool, have_te: bool):
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    kwargs = trainer_config.transformer_config_kwargs(model, layout, on_cpu=on_cpu, have_te=have_te)
    config_class = MLATransformerConfig if kwargs.get("multi_latent_attention") else TransformerConfig
    return config_class(**kwargs)


def _build_chunks(model, layout, config, seq_len: int, on_cpu: bool, have_te: bool, packed: bool = False):
    """One GPTModel per virtual pipeline stage on this rank, with its layers placed by Megatron (`packed`: it
    takes THD batches)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    chunks = []
    for vp_stage in range(layout.vpp) if layout.vpp > 1 else [None]:
        spec = _block_spec(config, on_cpu, have_te, vp_stage)
        if on_cpu:
            _use_cpu_modules(spec, config, layout, packed)
        chunk = GPTModel(
            config=config, transformer_layer_spec=spec,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            vp_stage=vp_stage, **trainer_config.model_kwargs(model, seq_len, layout.tp))
        if config.bf16:
            chunk.bfloat16()
        if not on_cpu:
            chunk.cuda()
        chunks.append(chunk)
    return chunks


def _block_spec(config, on_cpu: bool, have_te: bool, vp_stage):
    """Megatron's decoder block spec for this pipeline stage: the GPT spec, or for gated delta-net layers
    (Qwen3-Next) the experimental attention variant's, which Megatron builds from TE modules only (on CPU
    from the stand-ins cpu_compat points it at)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    if config.experimental_attention_variant is None:
        return get_gpt_decoder_block_spec(config, use_transformer_engine=have_te and not on_cpu,
                                          normalization=config.normalization, vp_stage=vp_stage)
    if not on_cpu and not have_te:
        raise RuntimeError("gated delta-net layers need Transformer Engine on GPU (Megatron-Core 0.19.2 builds "
                           "its experimental attention variant from TE modules only)")
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_transformer_block_with_experimental_attention_variant_spec,
    )

    return get_transformer_block_with_experimental_attention_variant_spec(config, vp_stage=vp_stage)


def _use_cpu_modules(spec, config, layout, packed: bool = False) -> None:
    """CPU stand-ins inside Megatron's layer specs: grouped experts (so moe_act recompute applies, as with TE)
    and, for CP, MLA, sliding windows, attention sinks or packed documents (THD), the CPU core attention (TE's
    role on GPU)."""
    from trainers.cp_attention import ContextParallelDotProductAttention
    from trainers.cpu_experts import grouped_experts_builder

    cpu_attention = (layout.cp > 1 or config.multi_latent_attention or config.window_size is not None
                     or config.softmax_type != "vanilla" or packed)
    for layer_spec in spec.layer_specs:
        mlp = layer_spec.submodules.mlp
        # The MoE spec is a ModuleSpec or a functools.partial(MoELayer, submodules=MoESubmodules(...)).
        moe_submodules = getattr(mlp, "submodules", None) or getattr(mlp, "keywords", {}).get("submodules")
        if moe_submodules is not None and hasattr(moe_submodules, "experts"):
            moe_submodules.experts = grouped_experts_builder()
        attention = layer_spec.submodules.self_attention.submodules
        if cpu_attention and hasattr(attention, "core_attention"):  # gated delta-net layers have none
            attention.core_attention = ContextParallelDotProductAttention


def _wrap_ddp_and_optimizer(chunks, config, layout, on_cpu: bool):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp_config = DistributedDataParallelConfig(**trainer_config.ddp_config_kwargs(layout, on_cpu))
    wrapped = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk,
                                       disable_bucketing=index > 0)
               for index, chunk in enumerate(chunks)]
    config.no_sync_func = [m.no_sync for m in wrapped] if len(wrapped) > 1 else wrapped[0].no_sync
    config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(OptimizerConfig(**trainer_config.optimizer_config_kwargs(layout)), wrapped)
    return wrapped, optimizer


class SyntheticTokens:
    """Fixed-shape token batches with a learnable rule (next = 5·prev + 7 + noise mod vocab), so the loss
    visibly falls within a few steps. Every layout sees the same global batch at a given step: DP rank d
    takes its share of rows, CP ranks their load-balanced chunks."""

    def __init__(self, vocab: int, seq_len: int, gbs: int, mbs: int, seed: int):
        self.vocab, self.seq_len, self.gbs, self.mbs, self.seed = vocab, seq_len, gbs, mbs, seed

    def global_batch(self, step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + step)
        tokens = torch.empty(self.gbs, self.seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.vocab, (self.gbs,), generator=gen)
        noise = torch.randint(0, 2, (self.gbs, self.seq_len), generator=gen)
        for t in range(self.seq_len):
            tokens[:, t + 1] = (5 * tokens[:, t] + 7 + noise[:, t]) % self.vocab
        return tokens

    def microbatches(self, step: int, dp_rank: int, dp_size: int, device, cp_group=None):
        from megatron.core.utils import get_batch_on_this_cp_rank

        rows = self.global_batch(step).chunk(dp_size)[dp_rank]
        for start in range(0, rows.shape[0], self.mbs):
            tokens = rows[start:start + self.mbs]
            batch = {
                "tokens": tokens[:, :-1].contiguous(),
                "labels": tokens[:, 1:].contiguous(),
                "loss_mask": torch.ones(tokens.shape[0], self.seq_len),
                "position_ids": torch.arange(self.seq_len).unsqueeze(0).expand(tokens.shape[0], -1).contiguous(),
            }
            if cp_group is not None and cp_group.size() > 1:
                batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=cp_group)
            yield {k: v.to(device) for k, v in batch.items()}


@dataclass
class StepState:
    """What forward_step needs to know about the running step."""
    step: int = 0
    first_call: bool = True
    measure_step: int = 0
    measured_chunks: set = field(default_factory=set)
    activation_bytes: int = 0
    activations_by_module: dict = field(default_factory=dict)


def _loss_func(loss_mask, output_tensor):
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    total = torch.sum(losses * mask)
    tokens = mask.sum().to(torch.int)
    return total, tokens, {"lm loss": torch.stack([total.detach().clone(), mask.sum().detach()])}


@dataclass
class Built:
    """The model for the trial's layout on this rank: chunks (one per virtual stage), DDP and optimizer."""
    device: torch.device
    config: object
    chunks: list
    wrapped: list
    optimizer: Any  # Megatron's optimizer (untyped)
    have_te: bool


def _model_flops(args, model, layout) -> float:
    """Bridge's FLOPs of a step; of packed documents each document's own attention (the expected packing)."""
    hist = _packing(args)
    if hist is None:
        return flops_per_step(model, args.seq_len, layout.gbs)
    stats = statistics_for(hist, args.seq_len, layout.cp, layout.tp, layout.sp)
    assert stats is not None  # a histogram gives statistics
    return packed_flops_per_step(model, args.seq_len, layout.gbs, stats)


def _packing(args):
    """The document-length histogram the trial packs (megatron_moe's --lengths), or None."""
    return getattr(args, "packing_histogram", None)


def _build(args, layout, model, on_cpu: bool) -> Built:
    from trainers import cpu_compat

    if on_cpu:
        cpu_compat.apply()
    device = _init_process_group(on_cpu, args.comm_timeout, layout.cuda_device_max_connections)
    have_te = _have_te() and not on_cpu
    if not have_te:
        cpu_compat.stand_in_for_transformer_engine_fp8()

    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    ps.initialize_model_parallel(**trainer_config.parallel_state_kwargs(layout, on_cpu))
    config = _build_config(model, layout, on_cpu, have_te)
    # CUDA graphs need a capturable RNG tracker (TE's, or Megatron's graph-safe one).
    tensor_parallel.model_parallel_cuda_manual_seed(args.seed, te_rng_tracker=config.use_te_rng_tracker,
                                                    use_cudagraphable_rng=config.cuda_graph_impl != "none")
    torch.manual_seed(args.seed)
    chunks = _build_chunks(model, layout, config, args.seq_len, on_cpu, have_te, _packing(args) is not None)
    wrapped, optimizer = _wrap_ddp_and_optimizer(chunks, config, layout, on_cpu)
    return Built(device, config, chunks, wrapped, optimizer, have_te)


@dataclass
class Steps:
    """What the warm-up and measured steps produced on this rank."""
    times: list[float]
    forward_backward: list[float]  # the schedule's share of each measured step (the rest is the optimizer)
    cpu_times: list[float]  # this process's CPU seconds in each measured step
    losses: list  # per step (sum of token losses, tokens) on last-stage ranks, else None
    activation_bytes: int
    activations_by_module: dict
    microbatches: int
    schedule: object
    routed: dict | None  # tokens into each MoE layer's router and rows into its experts (routing_load), or None
    packing: dict | None = None  # packed documents: real tokens and padding of the measured steps, or None
    stop: step_watch.Decision | None = None  # the rule that stopped the trial before its last step, or None


def _training_data(args, layout, model) -> SyntheticTokens | PackedTokens:
    """The trial's batches: synthetic token rows, or documents packed into each sequence (THD:
    trainers/packed_batches.py) when the trial packs."""
    data = SyntheticTokens(model.vocab_size, args.seq_len, layout.gbs, layout.mbs, args.seed)
    if _packing(args) is None:
        return data
    return PackedTokens(data, _packing(args), pad_multiple(layout.cp, layout.tp, layout.sp))


def _forward_step_func(built: Built, layout, state: StepState, saved, fault, rank: int):
    """Megatron's forward_step_func: a chunk's forward on the next microbatch. It fires the injected fault (if
    any) on a step's first call and, in the measured step, records what each chunk saves for backward."""
    chunk_index = {id(m): i for i, m in enumerate(built.wrapped)}

    def forward_step(data_iterator, chunk, return_schedule_plan: bool = False):
        if state.first_call:
            state.first_call = False
            if fault:
                fault.fire(state.step, rank)
        batch = next(data_iterator)
        if return_schedule_plan:
            # the EP overlap's combined 1F1B schedule asks the (unwrapped) GPTModel for the plan it then runs
            # beside another microbatch's backward: nothing runs here to record
            plan = chunk.build_schedule_plan(batch["tokens"], batch["position_ids"], None, labels=batch["labels"],
                                             packed_seq_params=batch.get("packed_seq_params"))
            return plan, partial(_loss_func, batch["loss_mask"])
        index = chunk_index[id(chunk)]
        record = state.step == state.measure_step and index not in state.measured_chunks
        # by module too, unless CUDA graphs: Megatron refuses user forward hooks on the modules it graphs
        with saved.recording(None if layout.cuda_graphs else chunk) if record else contextlib.nullcontext():
            output = chunk(batch["tokens"], batch["position_ids"], None, labels=batch["labels"],
                           packed_seq_params=batch.get("packed_seq_params"))
        if record:
            _add_saved_activations(state, saved, index)
        return output, partial(_loss_func, batch["loss_mask"])

    return forward_step


def _add_saved_activations(state: StepState, saved, index: int) -> None:
    """Count what chunk `index` saved for backward in the measured microbatch (in total and by module)."""
    state.measured_chunks.add(index)
    state.activation_bytes += saved.bytes
    for path, nbytes in saved.by_module().items():
        state.activations_by_module[path] = state.activations_by_module.get(path, 0) + nbytes
    saved.clear()


def _schedule_runner(schedule, forward_step, wrapped: list, microbatches: int, layout, seq_len: int, packed: bool):
    """One call of Megatron's forward-backward schedule over a step's microbatches, given their iterators (one
    per chunk); returns the losses it reduced (on last-stage ranks; empty elsewhere)."""
    def run(iterators: list):
        return schedule(
            forward_step_func=forward_step, data_iterator=iterators if len(wrapped) > 1 else iterators[0],
            model=wrapped if len(wrapped) > 1 else wrapped[0], num_microbatches=microbatches,
            # a THD pack holds the microbatch's sequences back to back, batch dimension 1. The full length:
            # the pipeline schedules divide it by CP (and by TP under SP) for the stage-to-stage tensors
            seq_length=(layout.mbs if packed else 1) * seq_len,
            micro_batch_size=1 if packed else layout.mbs, forward_only=False)

    return run


@dataclass
class StepTiming:
    """One step's seconds: wall clock of the whole step, of its schedule (forward and backward), and CPU."""
    seconds: float
    schedule_seconds: float
    cpu_seconds: float
    schedule_peak_gib: float  # this rank's peak memory once forward and backward were done, before the optimizer


def _timed_step(built: Built, run_schedule, iterators: list) -> tuple[list, StepTiming]:
    """One training step (zeroed gradients, the schedule, the optimizer step), timed between device syncs;
    returns the schedule's reduced losses and the step's timing."""
    _sync(built.device)
    start, cpu_start = time.perf_counter(), time.process_time()
    built.optimizer.zero_grad()
    for m in built.wrapped:
        m.zero_grad_buffer()
    reduced = run_schedule(iterators)
    _sync(built.device)
    schedule_done = time.perf_counter()
    schedule_peak = measure.peak_memory_gib(built.device)["allocated"]
    built.optimizer.step()
    _sync(built.device)
    end, cpu_end = time.perf_counter(), time.process_time()
    return reduced, StepTiming(end - start, schedule_done - start, cpu_end - cpu_start, schedule_peak)


def _step_loss(reduced) -> list[float] | None:
    """The step's [sum of token losses, tokens] from the schedule's reduced losses; None where there are none
    (ranks off the last pipeline stage)."""
    if not reduced:
        return None
    return [float(sum(r["lm loss"][0] for r in reduced)), float(sum(r["lm loss"][1] for r in reduced))]


def _train(args, layout, model, built: Built, rank: int, world: int) -> Steps:
    """The warm-up and measured steps on this rank, and what they produced."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    fault = faults.from_env()
    microbatches = layout.grad_accum(world)
    dp_rank, dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
    cp_group = ps.get_context_parallel_group()
    data = _training_data(args, layout, model)
    state = StepState(measure_step=max(args.warmup - 1, 0))
    saved = measure.SavedActivations(exclude=measure.param_storage_keys(built.wrapped))
    # Megatron refuses user forward hooks on the modules it graphs: no counts under CUDA graphs
    copies = routing_load.RoutedCopies(built.chunks) if model.num_experts and not layout.cuda_graphs else None
    forward_step = _forward_step_func(built, layout, state, saved, fault, rank)
    schedule = get_forward_backward_func()
    run_schedule = _schedule_runner(schedule, forward_step, built.wrapped, microbatches, layout, args.seq_len,
                                    packed=not isinstance(data, SyntheticTokens))
    timings, losses = [], []
    watch = step_watch.StepWatch(args, built.device, built.optimizer, layout.gbs * args.seq_len, world, rank,
                                 holds_loss=ps.get_tensor_model_parallel_rank() == 0)
    for step in range(args.warmup + args.steps):
        state.step, state.first_call = step, True
        if copies is not None:
            copies.active = step == state.measure_step
        iterators = [data.microbatches(step, dp_rank, dp_size, built.device, cp_group) for _ in built.wrapped]
        reduced, timing = _timed_step(built, run_schedule, iterators)
        if step >= args.warmup:
            timings.append(timing)
        losses.append(_step_loss(reduced))
        if watch.after_step(step, timing.seconds, timing.schedule_peak_gib, losses[-1]):
            break  # decided (measured enough, or will not fit): every rank stops at this step
    watch.close()
    measured = range(args.warmup, args.warmup + len(timings))
    packing = None if isinstance(data, SyntheticTokens) else data.report(measured)
    return Steps([t.seconds for t in timings], [t.schedule_seconds for t in timings],
                 [t.cpu_seconds for t in timings], losses, state.activation_bytes, state.activations_by_module,
                 microbatches, schedule, copies.remove() if copies is not None else None, packing, watch.decision)


def _rank_report(built: Built, steps: Steps, rank: int) -> dict:
    """This rank's figures, gathered on every rank and summed up by rank 0."""
    from megatron.core import parallel_state as ps

    modules = [m for c in built.chunks for m in c.modules()]
    return {
        "rank": rank,
        "pipeline_rank": ps.get_pipeline_model_parallel_rank(),
        "losses": steps.losses if ps.get_tensor_model_parallel_rank() == 0 else None,
        "step_times": steps.times,
        "forward_backward_times": steps.forward_backward,
        "cpu_times": steps.cpu_times,
        "memory_bytes": {**measure.static_components(built.wrapped, built.optimizer),
                         "activations_per_microbatch": steps.activation_bytes},
        "activations_by_module": steps.activations_by_module,
        "peak": measure.peak_memory_gib(built.device),
        "layers": sum(len(c.decoder.layers) for c in built.chunks),
        "dispatchers": sorted({type(m.token_dispatcher).__name__ for m in modules if hasattr(m, "token_dispatcher")}),
        "core_attention": sorted({type(m.core_attention).__name__ for m in modules if hasattr(m, "core_attention")}),
        "attention": sorted({type(m.self_attention).__name__ for m in modules if hasattr(m, "self_attention")}),
        "experts": sorted({type(m.experts).__name__ for m in modules if getattr(m, "experts", None) is not None}),
        "graphs_captured": _graphs_captured(),
        "routed": steps.routed,
        "packing": steps.packing,
        "expert_group": (ps.get_pipeline_model_parallel_rank(), ps.get_expert_data_parallel_rank(),
                         ps.get_expert_tensor_parallel_rank()),
    }


def run_trial(args, layout, model, gpu, result, rank: int, world: int, on_cpu: bool) -> None:
    from megatron.core import parallel_state as ps

    built = _build(args, layout, model, on_cpu)
    steps = _train(args, layout, model, built, rank, world)
    gathered = [None] * world
    dist.all_gather_object(gathered, _rank_report(built, steps, rank))
    if steps.stop is not None and steps.stop.rule == WILL_NOT_FIT:
        if rank == 0:  # stopped before the OOM: nothing measured to judge
            step_watch.fill_will_not_fit(result, steps.stop, gathered, len(steps.losses))
        return
    applied = _applied(ps, built.config, model, layout, built.optimizer, steps.schedule, steps.microbatches,
                       gathered, on_cpu, built.have_te)
    if rank == 0:
        _fill_result(result, args, layout, model, gpu, world, gathered, applied)
        step_watch.annotate(result, steps.stop)


def host_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _graphs_captured() -> int:
    try:
        from megatron.core.transformer.cuda_graphs import _CudagraphGlobalRecord
    except ImportError:
        return 0
    return len(_CudagraphGlobalRecord.cudagraph_record) if _CudagraphGlobalRecord.cudagraph_created else 0


def _applied(ps, config, model, layout, optimizer, forward_backward, microbatches, gathered, on_cpu,
             have_te) -> dict:
    return {
        "tp": ps.get_tensor_model_parallel_world_size(),
        "cp": ps.get_context_parallel_world_size(),
        "ep": ps.get_expert_model_parallel_world_size(),
        "etp": ps.get_expert_tensor_parallel_world_size(),
        "pp": ps.get_pipeline_model_parallel_world_size(),
        "vpp": ps.get_virtual_pipeline_model_parallel_world_size() or 1,
        "dp": ps.get_data_parallel_world_size(),
        "edp": ps.get_expert_data_parallel_world_size(),
        "microbatches": microbatches,
        "sequence_parallel": bool(config.sequence_parallel),
        "dispatcher": sorted({d for g in gathered for d in g["dispatchers"]}),
        "routing": routing_load.routing_in_effect(config) if model.num_experts else None,
        "ep_overlap": bool(getattr(config, "overlap_moe_expert_parallel_comm", False)) if model.num_experts else None,
        "expert_load": routing_load.expert_load(gathered, model.topk, layout.etp) if model.num_experts else None,
        "core_attention": sorted({a for g in gathered for a in g["core_attention"]}),
        "attention": sorted({a for g in gathered for a in g["attention"]}),  # e.g. GatedDeltaNet, SelfAttention
        "experts": sorted({e for g in gathered for e in g["experts"]}),
        "cp_comm_type": ("allgather (CPU attention)" if on_cpu else config.cp_comm_type) if layout.cp > 1 else None,
        "recompute": {"granularity": config.recompute_granularity or "none",
                      "modules": (list(config.recompute_modules or [])
                                  if config.recompute_granularity == "selective" else []),
                      "method": config.recompute_method, "num_layers": config.recompute_num_layers},
        "cuda_graphs": {"impl": config.cuda_graph_impl,
                        "modules": [str(m) for m in (config.cuda_graph_modules or [])] if layout.cuda_graphs else [],
                        "captured": max(g["graphs_captured"] for g in gathered)},
        "precision": {"params_dtype": str(config.params_dtype).removeprefix("torch."),
                      "fp8": config.fp8, "fp8_recipe": config.fp8_recipe if config.fp8 else None},
        "distributed_optimizer": layout.distributed_optimizer,
        "optimizer": type(optimizer).__name__,
        "schedule": forward_backward.__name__,
        "layers_per_rank": [g["layers"] for g in gathered],
        "pipeline_split": trainer_config.pipeline_split_kwargs(model, layout),
        "backend": "gloo" if on_cpu else "nccl",
        "transformer_engine": have_te,
    }


def _fill_result(result, args, layout, model, gpu, world, gathered, applied) -> None:
    # Each step ends when the slowest rank finishes it.
    measured = min(len(g["step_times"]) for g in gathered)  # args.steps, or fewer once measured enough
    step_times = [max(g["step_times"][i] for g in gathered) for i in range(measured)]
    schedule = [max(g["forward_backward_times"][i] for g in gathered) for i in range(measured)]
    step_time = statistics.mean(step_times) if step_times else None
    per_rank, heaviest, inflight, components = _heaviest_rank(layout, world, gathered, applied["microbatches"])
    peaks = [g["peak"]["allocated"] for g in gathered]

    result.loss = _step_losses(args.warmup + measured, gathered)
    result.step_times_s = step_times
    result.step_time_s = step_time
    result.applied = applied
    result.memory_gib = per_rank[heaviest]
    result.peak_memory_gib_per_rank = peaks
    result.peak_memory_gib = max(peaks)
    result.extra.update(
        memory_gib_rank=heaviest,
        # bytes saved for backward per module path in one microbatch on that rank (measure.SavedActivations)
        activations_by_module=gathered[heaviest]["activations_by_module"],
        memory_gib_per_rank=per_rank,
        pipeline_rank_per_rank=[g["pipeline_rank"] for g in gathered],
        peak_reserved_gib_per_rank=[g["peak"]["reserved"] for g in gathered],
        warmup=args.warmup,
        model_overrides={"num_layers": args.num_layers, "hidden_size": args.hidden_size},
        loss_includes_warmup=True,
        tokens_per_step=layout.gbs * args.seq_len,
        # what a proxy trial's composition needs: the schedule (forward, backward, pipeline) and the optimizer
        step_parts_s={"forward_backward": statistics.mean(schedule) if schedule else None,
                      "optimizer": statistics.mean(t - f for t, f in zip(step_times, schedule)) if schedule else None},
        inflight_microbatches=inflight,
        peak_components_gib=components,  # the peak the cost model predicts, without buffers and runtime
        # CPU work of a step, all ranks together (ranks sharing a host's cores cannot finish it faster than
        # cores allow: what a proxy's composition needs on CPU)
        cpu_seconds_per_step=sum(statistics.mean(g["cpu_times"]) for g in gathered if g["cpu_times"]),
        host_cores=host_cores(),
    )
    _fill_throughput(result, args, layout, model, gpu, world, step_time, gathered[0]["packing"])
    # the sweep's own judgement (layout in effect, finite numbers, TF/s and tokens/s below the chip's peak,
    # memory within the device, tokens/s agreeing with the step time) on the spot
    result.status = "ok"
    judged = validation.validate(result, layout, gpu, model=model, seq_len=args.seq_len, num_gpus=world)
    result.status, result.error = judged.status, judged.error


def _step_losses(steps: int, gathered) -> list[float]:
    """Each step's loss over every rank's tokens (NaN for a step no rank reported a loss of)."""
    loss = []
    for step in range(steps):
        parts = [g["losses"][step] for g in gathered if g["losses"] and g["losses"][step]]
        total, tokens = sum(p[0] for p in parts), sum(p[1] for p in parts)
        loss.append(total / tokens if tokens else float("nan"))
    return loss


def _heaviest_rank(layout, world: int, gathered, microbatches: int) -> tuple[list[dict], int, float, float]:
    """Every rank's memory in GiB, the most loaded rank (the cost model's: static memory plus the activations of
    the microbatches it holds at once; under 1F1B the first pipeline stage holds the most), that rank's in-flight
    microbatches and its load."""
    per_rank = [{k: v / measure.GIB for k, v in g["memory_bytes"].items()} for g in gathered]

    def inflight(r: int) -> float:
        return measure.inflight_microbatches(gathered[r]["pipeline_rank"], layout.pp, layout.vpp, microbatches)

    def load(r: int) -> float:
        m = per_rank[r]
        return m["weights"] + m["gradients"] + m["optimizer_states"] + inflight(r) * m["activations_per_microbatch"]

    heaviest = max(range(world), key=load)
    return per_rank, heaviest, inflight(heaviest), load(heaviest)


def _fill_throughput(result, args, layout, model, gpu, world: int, step_time, packing) -> None:
    """Tokens/s per GPU (real tokens only: padding is computed, never counted), TF/s per GPU and MFU from the mean
    step time; a packed run's packing figures (every rank draws the same documents: rank 0's)."""
    if packing is not None:
        result.extra["packing"] = packing
    if step_time:
        share = packing["useful_token_share"] if packing is not None else 1.0
        result.tokens_per_sec_per_gpu = layout.gbs * args.seq_len / step_time / world * share
        result.tflops_per_gpu = _model_flops(args, model, layout) / step_time / world / 1e12
        result.mfu = result.tflops_per_gpu / gpu.peak(layout.precision)
