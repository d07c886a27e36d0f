"""The flat run configuration: every field of the seed table, with its default and range.

Field names are globally unique and match the product documentation exactly. Python
defaults equal the shipped ``default_train.yaml`` (a test keeps the two identical).
Model-level checks (types, ranges, cross-field rules that need no registry) live here;
checks against installed plugins live in ``telescope.core.config.validate``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from telescope.core.config.entries import EnvironmentEntry, EvalEntry

__all__ = ["TelescopeConfig"]

Dtype = Literal["float32", "float16", "bfloat16"]
Placement = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
HealthAction = Literal["off", "warn", "stop", "rollback"]

DEFAULT_CODE_EXCLUDE = [".git", ".venv", "__pycache__", "*.egg-info", "runs", "wandb", "node_modules"]


class TelescopeConfig(BaseModel):
    """A complete, resolved Telescope run configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)

    # --- General -------------------------------------------------------------------
    debug: bool = False
    """Enable debug mode: full tracebacks and DEBUG logs of every telescope.* logger, on the driver and in
    every Ray worker (same as ``telescope train --debug``)."""
    plugins: list[str] = Field(default_factory=list)
    """Local plugins to load besides the installed ones: Python files (relative to the config file)
    or module names, e.g. [my_env.py]; Ray workers load the same (also: telescope train -p FILE)."""
    seed: int = 0
    """Seed for every random choice (sampling of prompts, environments, model init)."""
    run_dir: str | None = None
    """Run directory for logs, rollouts and checkpoints. null = runs/<wandb_run_name>."""
    overwrite: bool = False
    """Replace the previous run in a non-empty run_dir (deletes its files). false = refuse to start there."""

    # --- Model ---------------------------------------------------------------------
    model: str = "Qwen/Qwen2.5-3B"
    """Hugging Face model identifier, local path, or a built-in demo model (telescope/tiny-*)."""
    model_dtype: Dtype = "float32"
    """Model weight precision."""
    mixed_precision_dtype: Dtype | None = "bfloat16"
    """FSDP mixed precision compute dtype. null to disable."""
    inference_dtype: Dtype | None = None
    """Dtype the inference servers run in and weights are broadcast in (cast on the trainer, bucket by bucket). null = the trainer's compute dtype (mixed_precision_dtype, else model_dtype)."""

    # --- Environments and evals ----------------------------------------------------
    environments: list[EnvironmentEntry] = Field(min_length=1)
    """Training environments (at least one)."""
    evals: list[EvalEntry] = Field(default_factory=list)
    """Evals run before, during and after training."""

    # --- Workers -------------------------------------------------------------------
    inference_num_workers: int = Field(default=2, ge=1)
    """Number of inference workers (GPUs for vLLM). Must be divisible by inference_tensor_parallel_size."""
    inference_tensor_parallel_size: int = Field(default=1, ge=1)
    """Tensor parallelism degree for each inference server."""
    trainer_num_workers: int = Field(default=2, ge=1)
    """Number of FSDP/Megatron trainer workers."""
    inference_engine: Literal["auto", "vllm", "transformers"] = "auto"
    """Inference engine: vllm (GPU), transformers (embedded, runs anywhere), auto = vllm when usable."""
    inference_engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Engine-specific options, validated by the chosen engine's kwargs model."""

    # --- Orchestrator --------------------------------------------------------------
    max_concurrent_prompts_per_server: int = Field(default=32, ge=1)
    """Max concurrent prompts per inference server."""
    prompts_batch_size_for_trainer: int = Field(default=16, ge=1)
    """Number of prompt groups per training batch."""
    number_of_steps: int = Field(default=300, ge=1)
    """Total training steps."""
    max_async_rollout: int = Field(default=2, ge=0)
    """How many training steps inference can run ahead. 0 = fully synchronous."""
    discard_group_zero_advantage: bool = True
    """Drop groups where all samples got identical rewards (no learning signal)."""
    enable_prompt_prefetch: bool = True
    """Prefetch prompts from the dataset."""
    prompt_prefetch_buffer_size: int = Field(default=24, ge=1)
    """Number of prompts to prefetch."""
    enable_individual_sample_lanes: bool = True
    """Each sample gets its own lane slot instead of one per group."""
    free_lane_after_generation: bool = True
    """Free the inference lane when generation completes, before reward computation."""
    max_off_policy_steps: int = Field(default=8, ge=-1)
    """Cancel in-flight rollouts after this many weight updates (-1 disables cancellation)."""
    routing_policy: Literal["pinned", "sticky", "least_loaded", "sticky_least_loaded"] = "sticky_least_loaded"
    """Which server answers each request of a rollout (every turn, every sample of a group): sticky_least_loaded = the server holding its prefix (prefix cache), except that a later turn goes to the least loaded server when its server runs more than routing_saturation_margin requests beyond the least loaded AND the conversations that server holds no longer fit in its prefix cache (a move re-prefills the whole conversation; vLLM: the KV cache size its /metrics reports; the transformers engine keeps no prefix cache, so load alone decides there); a rollout's first request stays with its group's prompt (the lanes balance group starts); sticky = a hash of the group, whatever the load; least_loaded = the fewest requests in flight; pinned = the server the group was placed on. Metrics: routing/moves, routing/sticky, routing/held_tokens_max."""
    routing_saturation_margin: int = Field(default=8, ge=0)
    """Requests in flight a server may run beyond the least loaded one before sticky_least_loaded may send a later turn elsewhere (only once that server's conversations also overflow its prefix cache, where its size is known)."""
    context_compaction_at_tokens: int | None = Field(default=None, ge=1)
    """Multi-turn rollouts: when the next turn's prompt would pass this many tokens, the policy summarizes the conversation and the rollout continues from system prompt + task + summary, each part trained as its own sequence with the rollout's advantage (null = off: a rollout reaching max_model_len stops)."""
    context_compaction_max_per_rollout: int = Field(default=4, ge=1)
    """Most compactions of one rollout; past it the rollout stops as if out of context (stop reason context_exhausted)."""
    context_compaction_train_summary: bool = True
    """Train the summary tokens the policy wrote (once, in their own sequence); false = keep them out of the loss."""
    context_compaction_attempts: int = Field(default=2, ge=1)
    """Tries to get a usable summary (non-empty, ended within max_tokens) before the rollout ends as an infrastructure failure (cause compaction_failed): retried, then masked (infra_max_retries_per_sample), never scored as a reward of 0."""
    infra_max_retries_per_sample: int = Field(default=2, ge=0)
    """Times a sample hit by an infrastructure failure (a sandbox that could not be created, a provider timeout or 5xx, an inference server that died mid-request; never the model's output) runs again, with backoff, before it is masked: its group trains on its other samples (dropped when fewer than 2 remain). It never scores 0."""
    infra_retry_backoff_s: float = Field(default=1.0, ge=0)
    """Seconds before the first retry of a sample hit by an infrastructure failure; doubled for each further retry (at most 60)."""
    infra_max_failure_rate: float = Field(default=0.5, gt=0, le=1)
    """End the run, naming the provider and the cause, when more than this share of the last infra_failure_window sample attempts failed for the infrastructure (1 = never)."""
    infra_failure_window: int = Field(default=200, ge=1)
    """Sample attempts the infrastructure failure rate (infra_max_failure_rate) is measured over; the rule waits for a full window."""
    stall_timeout_s: float = Field(default=1800.0, ge=0)
    """Fail the run, with a dump of what every server, lane and group is doing, when no training step completes for this many seconds (0 = never)."""
    trainer_overdue_factor: float = Field(default=10.0, ge=0)
    """A step running longer than this many times the median of the recent steps (and trainer_overdue_floor_s) while a trainer rank does not answer its heartbeat or is stuck in one phase is a hung trainer: the run restarts from its latest checkpoint (max_run_restarts) or fails naming the rank and phase (0 = never)."""
    trainer_overdue_floor_s: float = Field(default=60.0, ge=0)
    """The least time, in seconds, a step runs before it can count as overdue (trainer_overdue_factor), whatever the median step."""
    inference_overdue_factor: float = Field(default=10.0, ge=0)
    """An inference server whose generating samples have had no answer for longer than this many times the median generation time of the recent samples (and inference_overdue_floor_s), and whose /health does not answer either, is frozen or hung: it is killed (SIGKILL) and restarted like a dead one, its groups re-queued (inference_max_restarts; 0 = never)."""
    inference_overdue_floor_s: float = Field(default=60.0, ge=0)
    """The least time, in seconds, a server's generating samples go without an answer before it can count as frozen (inference_overdue_factor), whatever the median generation time."""
    inference_max_restarts: int = Field(default=3, ge=0)
    """How many times each inference server that dies is restarted (re-synced to the current weights, its groups re-queued) before the run fails."""

    # --- Trainer -------------------------------------------------------------------
    learning_rate: float = Field(default=1.0e-6, gt=0)
    """Learning rate (must be > 0)."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Weight decay coefficient."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Maximum gradient norm for clipping."""
    lr_scheduler: Literal["none", "constant", "linear", "cosine"] = "constant"
    """LR schedule: none = fixed; constant = warmup then constant; linear/cosine = warmup then decay."""
    warmup_steps: int = Field(default=0, ge=0)
    """Number of linear warmup steps."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Minimum LR as a fraction of learning_rate for linear/cosine decay. Range: [0, 1]."""
    train_backend: str = "fsdp"
    """Training backend (a registered trainer backend: fsdp, megatron, ...)."""
    train_backend_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Backend-specific options, validated by the backend's kwargs model (see telescope plugins list)."""

    # --- LoRA ----------------------------------------------------------------------
    lora_rank: int = Field(default=0, ge=0)
    """LoRA rank: > 0 trains only low-rank adapters (peft) on the frozen base model, and checkpoints and syncs only them. 0 = full fine-tuning."""
    lora_alpha: float = Field(default=16.0, gt=0)
    """LoRA scaling numerator: the adapter's update is scaled by lora_alpha / lora_rank."""
    lora_dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapters' input during training. Range: [0, 1). Keep 0 for RL: the trainer's logprobs must match the servers'."""
    lora_target_modules: list[str] | None = None
    """Module names that get adapters (peft target_modules), e.g. [q_proj, v_proj]. null = the attention and MLP projections of the architecture."""

    # --- Algorithm -----------------------------------------------------------------
    algorithm: str = "grpo"
    """RL algorithm (a registered algorithm: grpo, rloo, reinforce_pp, dr_grpo, cispo, gspo, sapo, ...)."""
    number_of_minibatches: int = Field(default=1, ge=1)
    """PPO-style gradient steps per rollout batch. >1 enables multiple update passes."""
    advantage_norm: Literal["group", "batch"] = "group"
    """Normalize advantages within each prompt group or across the training batch."""
    use_ppo_clip: bool = False
    """Apply PPO ratio clipping. Incompatible with cispo, gspo, sapo."""
    ppo_clip_ref_logprobs: Literal["rollout", "batch"] = "rollout"
    """Reference logprobs for PPO clipping: rollout = inference logprobs; batch = recomputed by the trainer."""
    clip_low: float = Field(default=0.4, ge=0, le=1)
    """PPO clip lower bound: ratio is clamped to 1 - clip_low. Range: [0, 1]."""
    clip_high: float = Field(default=0.5, ge=0)
    """PPO clip upper bound: ratio is clamped to 1 + clip_high."""
    sapo_tau_pos: float = Field(default=1.0, gt=0)
    """SAPO sigmoid sharpness for positive advantages."""
    sapo_tau_neg: float = Field(default=1.05, gt=0)
    """SAPO sigmoid sharpness for negative advantages."""
    dr_grpo_loss_agg_mode: Literal["token_mean", "token_sum_norm"] = "token_mean"
    """DR-GRPO loss aggregation. token_sum_norm removes response-level length bias."""
    use_tis: bool = False
    """Truncated importance sampling for inference/trainer logprob correction: weight min(π/μ, tis_cap); with a ratio loss (PPO clip, cispo, gspo, sapo) min(π_old/μ, tis_cap), which needs ppo_clip_ref_logprobs: batch."""
    tis_cap: float = Field(default=2.0, gt=0)
    """Max importance weight for TIS."""
    tis_logprob_clamp: float = Field(default=20.0, gt=0)
    """Logprob clamping threshold for TIS."""
    entropy_chunk_size: int = Field(default=1024, ge=1)
    """Chunk size (tokens) for logprob and entropy computation."""

    # --- On-policy distillation ----------------------------------------------------
    distill_teacher_model: str | None = None
    """Teacher for on-policy distillation (docs/distillation.md): a Hugging Face id, local path or demo model served on its own inference workers; with distill_teacher_base_url, the model name sent to that endpoint and whose tokenizer is checked. null = no distillation."""
    distill_teacher_base_url: str | None = None
    """OpenAI-compatible endpoint of the teacher (vLLM, telescope serve) answering /v1/completions with prompt_logprobs for token-id prompts, e.g. http://127.0.0.1:8000. null = serve distill_teacher_model locally."""
    distill_teacher_num_workers: int = Field(default=1, ge=1)
    """Inference workers serving a local teacher (its own pool, placed like the policy's); unused with distill_teacher_base_url."""
    distill_kl_coef: float = Field(default=1.0, ge=0)
    """Weight of the per-token distillation advantage: distill_kl_coef * (teacher_logprob - student_logprob) on every completion token."""
    distill_reward_weight: float = Field(default=1.0, ge=0)
    """Weight of the environment reward's advantage in the mix with the teacher's signal. 0 = pure distillation."""
    distill_teacher_timeout_s: float = Field(default=120.0, gt=0)
    """How long one teacher request may take before it is retried."""
    distill_teacher_max_retries: int = Field(default=3, ge=0)
    """Retries of a failed or timed-out teacher request; then an infrastructure failure (cause ``teacher_error``): its samples are retried and, when ``infra_max_retries_per_sample`` runs out, masked (never a zero signal). A 4xx (wrong key, model or request) is the setup's error, not retried."""
    distill_teacher_batch_size: int = Field(default=64, ge=1)
    """Most sequences one teacher request carries (samples finishing together are scored in one request)."""

    # --- Rollout / sampling --------------------------------------------------------
    group_size: int = Field(default=8, ge=1)
    """Number of completions sampled per prompt."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling probability. null = disabled."""
    max_tokens: int = Field(default=3700, ge=1)
    """Maximum generation tokens per completion."""
    interleaved_rollouts: bool = True
    """Exact token reuse across turns: avoids re-tokenization mismatches in multi-turn environments."""

    # --- Sequence packing ----------------------------------------------------------
    seq_len: int = Field(default=4096, ge=1)
    """Maximum sequence length for packing."""
    pad_to_multiple_of: int = Field(default=64, ge=1)
    """Pad packed sequences to this alignment."""

    # --- Inference server ----------------------------------------------------------
    inference_host: str = "127.0.0.1"
    """Host address for inference servers: loopback by default (they have no authentication); set
    0.0.0.0 (or the node's address) on a multi-node cluster so the driver on another node reaches them."""
    inference_base_port: int = Field(default=8100, ge=1, le=65535)
    """Base port for inference servers (taken by another run or program: the next free block, logged)."""
    inference_access_log: bool = False
    """Log every HTTP request in logs/inference/server_N.log; false = one summary line per minute instead."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Fraction of GPU memory allocated to vLLM. Range: (0, 1]."""
    max_model_len: int = Field(default=4096, ge=1)
    """Maximum context length for the inference engine."""
    vllm_scheduling_policy: Literal["priority", "fcfs"] = "priority"
    """priority = turn-aware scheduling for multi-turn; fcfs = first-come-first-served."""
    vllm_weight_reload: Literal["auto", "layerwise"] = "auto"
    """How a vLLM server loads a weight sync: auto = in place with vLLM's own weight loaders when every layer is unquantized (then re-packed for its kernels; faster, see bench/vllm_sync.py), else vLLM's layer-wise reload; layerwise = always vLLM's layer-wise reload."""
    enable_thinking: bool = False
    """Pass enable_thinking=True to apply_chat_template() for models with native thinking support."""
    chat_template: str | None = None
    """Jinja2 chat template overriding the tokenizer's own (required for base models without one)."""
    agent_tool_call_parser: Literal["xml", "python"] = "xml"
    """How the agent gateway reads tool calls from the model's text: xml (<tool_call>{json}</tool_call>, Hermes/Qwen) or python (name(arg=...) calls of the request's tools)."""

    # --- Checkpointing -------------------------------------------------------------
    checkpoint_every: int | bool = False
    """Save every N steps. 0 or false to disable."""
    checkpoint_save_training_state: bool = True
    """Include optimizer/scheduler state for resume. false = weights only."""
    resume_from_checkpoint: bool | int = False
    """true = resume from the latest checkpoint; an integer = resume from that step."""
    checkpoint_dir: str | None = None
    """Custom checkpoint path. Default: RUN_DIR/checkpoints."""
    checkpoint_keep_last: int | None = Field(default=None, ge=1)
    """Keep only the N most recent checkpoints."""
    checkpoint_keep_every: int | None = Field(default=None, ge=1)
    """Always keep checkpoints at these step multiples."""
    checkpoint_failure: Literal["stop", "warn"] = "stop"
    """A checkpoint that cannot be written (disk full, ...): stop = end the run, warn = train on without it."""
    max_run_restarts: int = Field(default=2, ge=0)
    """Restarts from the latest checkpoint after a trainer failure (a dead rank); 0 = a failure ends the run."""

    # --- Health (docs/health.md) ---------------------------------------------------
    health_window_steps: int = Field(default=10, ge=2)
    """Healthy steps each health rule compares a step with: their median and median absolute deviation (the run's own recent history)."""
    health_min_history_steps: int = Field(default=1, ge=1)
    """Healthy steps a health rule collects before it judges a step (nonfinite and reward_saturated need none)."""
    health_patience_steps: int = Field(default=2, ge=1)
    """Anomalous steps in a row that raise a health finding (nonfinite: the first one)."""
    health_max_rollbacks: int = Field(default=2, ge=0)
    """Health rollbacks a run makes; after that a finding whose action is rollback stops the run."""
    health_rollback_lr_factor: float = Field(default=0.5, gt=0, le=1)
    """A health rollback continues from its checkpoint with the learning rate times this."""
    health_entropy_collapse_action: HealthAction = "warn"
    """What entropy_collapse does: off, warn (a console line, the health/entropy_collapse metric, a timeline marker), stop (checkpoint, then end the run naming it) or rollback (restart from a checkpoint before it at a lower learning rate); docs/health.md."""
    health_entropy_collapse_ratio: float = Field(default=0.25, gt=0, lt=1)
    """entropy_collapse: the policy's entropy falls below this share of its recent median."""
    health_kl_spike_action: HealthAction = "warn"
    """What kl_spike does: off, warn (a console line, the health/kl_spike metric, a timeline marker), stop (checkpoint, then end the run naming it) or rollback (restart from a checkpoint before it at a lower learning rate); docs/health.md."""
    health_kl_spike_mads: float = Field(default=10.0, gt=0)
    """kl_spike: kl_divergence_inference rises above its recent median plus this many robust standard deviations (1.4826 x MAD, at least 10% of the median)."""
    health_kl_spike_min: float = Field(default=0.5, ge=0)
    """kl_spike: ... and above this many nats per token (a KL this small is never a spike)."""
    health_kl_spike_max: float = Field(default=1.0, gt=0)
    """kl_spike: ... or above this many nats per token whatever the history (a KL that creeps up this far is one too)."""
    health_grad_norm_spike_action: HealthAction = "warn"
    """What grad_norm_spike does: off, warn (a console line, the health/grad_norm_spike metric, a timeline marker), stop (checkpoint, then end the run naming it) or rollback (restart from a checkpoint before it at a lower learning rate); docs/health.md."""
    health_grad_norm_spike_mads: float = Field(default=10.0, gt=0)
    """grad_norm_spike: the gradient norm (before clipping) rises above its recent median plus this many robust standard deviations (1.4826 x MAD, at least 10% of the median)."""
    health_length_blowup_action: HealthAction = "warn"
    """What length_blowup does: off, warn (a console line, the health/length_blowup metric, a timeline marker), stop (checkpoint, then end the run naming it) or rollback (restart from a checkpoint before it at a lower learning rate); docs/health.md."""
    health_length_blowup_ratio: float = Field(default=2.0, gt=1)
    """length_blowup: the mean completion length rises above this many times its recent median."""
    health_length_blowup_truncated_share: float = Field(default=0.5, gt=0, le=1)
    """length_blowup: ... or at least this share of completions hit max_tokens, and at least halfway from the run's starting share to all of them; judged only while the starting share is below this (a run truncated from its first steps has no room to grow)."""
    health_length_collapse_action: HealthAction = "warn"
    """What length_collapse does: off, warn (a console line, the health/length_collapse metric, a timeline marker), stop (checkpoint, then end the run naming it) or rollback (restart from a checkpoint before it at a lower learning rate); docs/health.md."""
    health_length_collapse_ratio: float = Field(default=0.3, gt=0, lt=1)
    """length_collapse: the mean completion length falls below this share of its recent median."""
    health_reward_saturated_action: HealthAction = "warn"
    """What reward_saturated does: off, warn (a console line, the health/reward_saturated metric, a timeline marker), stop (checkpoint, then end the run naming it) or rollback (restart from a checkpoint before it at a lower learning rate); docs/health.md."""
    health_reward_saturated_groups: int = Field(default=64, ge=2)
    """reward_saturated: the finished rollout groups it looks back over (kept or discarded)."""
    health_reward_saturated_share: float = Field(default=0.95, gt=0, le=1)
    """reward_saturated: at least this share of those groups gave every sample the same reward (no learning signal)."""
    health_degenerate_outputs_action: HealthAction = "warn"
    """What degenerate_outputs does: off, warn (a console line, the health/degenerate_outputs metric, a timeline marker), stop (checkpoint, then end the run naming it) or rollback (restart from a checkpoint before it at a lower learning rate); docs/health.md."""
    health_degenerate_outputs_share: float = Field(default=0.5, gt=0, le=1)
    """degenerate_outputs: at least this share of a step's distinct prompts got one and the same completion, when recently less than half of it did."""
    health_nonfinite_action: HealthAction = "warn"
    """What nonfinite does: off, warn (a console line, the health/nonfinite metric, a timeline marker), stop (checkpoint, then end the run naming it) or rollback (restart from a checkpoint before it at a lower learning rate); docs/health.md."""

    # --- Evals ---------------------------------------------------------------------
    eval_before_training: bool = True
    """Run evaluations before training starts."""
    eval_after_training: bool = True
    """Run evaluations after training ends."""
    eval_num_servers: int = Field(default=1, ge=0)
    """Dedicated eval servers reserved from the inference pool. 0 = no periodic evals during training."""
    eval_start_end_use_all_servers: bool = True
    """Use all inference servers for start/end evals."""

    # --- Logging -------------------------------------------------------------------
    use_wandb: bool = True
    """Enable Weights & Biases logging."""
    wandb_project: str = "telescope"
    """W&B project name."""
    wandb_run_name: str = "telescope_run"
    """W&B run name (also names the default run directory)."""
    wandb_tags: list[str] = Field(default_factory=lambda: ["telescope"])
    """W&B tags."""
    wandb_upload_code: bool = True
    """Upload source code to W&B."""
    wandb_upload_logs: bool = True
    """Upload trainer/inference logs to W&B."""
    wandb_upload_logs_detailed: bool = False
    """Include detailed logs in the W&B upload."""
    wandb_upload_logs_stdout: bool = False
    """Include stdout logs in the W&B upload."""
    wandb_code_max_file_size_mb: float = Field(default=2.0, gt=0)
    """Max file size for code upload."""
    wandb_code_exclude_patterns: list[str] = Field(default_factory=lambda: list(DEFAULT_CODE_EXCLUDE))
    """Glob patterns to exclude from code upload."""
    use_tensorboard: bool = False
    """Write TensorBoard event files: step metrics and per-step span durations as scalars, rollouts and eval samples as text (needs `pip install tensorboard`)."""
    tensorboard_dir: str | None = None
    """TensorBoard log directory. null = RUN_DIR/tensorboard (view with `tensorboard --logdir RUN_DIR/tensorboard`)."""
    use_mlflow: bool = False
    """Log to MLflow: step metrics, the config as params, rollouts, evals and run info as artifacts (needs `pip install mlflow-skinny`)."""
    mlflow_tracking_uri: str | None = None
    """MLflow tracking URI (`http://host:5000`, `sqlite:///mlflow.db`, a folder ...). null = $MLFLOW_TRACKING_URI when set, else a file store in RUN_DIR/mlruns."""
    mlflow_experiment_name: str = "telescope"
    """MLflow experiment the run is logged under (created when missing); the run is named wandb_run_name."""
    system_metrics_collection_interval_seconds: float = Field(default=1.0, gt=0)
    """System metrics collection interval."""
    torch_memory_sample_interval_seconds: float = Field(default=0.1, gt=0)
    """PyTorch memory sampling interval."""
    event_tail_window_seconds: int = Field(default=60, ge=1)
    """Tail window for event aggregation."""
    event_block_duration_seconds: int = Field(default=1800, ge=1)
    """Duration of event blocks."""
    event_upload_interval_seconds: int = Field(default=5, ge=1)
    """Event upload interval."""
    metrics_logger_interval_seconds: float = Field(default=2.0, gt=0)
    """Metrics logger flush interval."""
    ray_torch_memory_drain_interval_seconds: float = Field(default=0.5, gt=0)
    """Interval for draining Ray torch memory metrics."""
    rollout_block_size: int = Field(default=500, ge=1)
    """Block size for rollout event grouping."""
    rollout_token_view_max_tokens: int = Field(default=512, ge=0)
    """Rollout records of completions up to this many tokens also hold each token's text and
    sampler logprob (the dashboard's token view; about 21 bytes a token). 0 = never."""
    track_gpu_events: bool = True
    """Track GPU utilization events."""

    # --- Ray cluster ---------------------------------------------------------------
    ray_address: str = "auto"
    """Ray cluster address. auto = the cluster `ray start` runs on this machine, else a private local one
    (never another run's or program's private cluster)."""
    ray_auto_start_local: bool = True
    """Auto-start a local Ray cluster if none is running."""
    ray_network_namespace: Literal["auto", "required", "off"] = "auto"
    """`telescope train` with a private Ray cluster runs inside its own network namespace (user-mode
    outbound network through pasta, no port forwarded in): Ray's ports, which listen on every
    interface, and every server of the run are reachable from the run only. auto = when the run
    starts a private cluster, listens on loopback only and `unshare`/`pasta` work here, else it says
    why not; required = fail instead; off = never (Ray's ports then answer other hosts, token-protected)."""
    ray_namespace: str = "telescope"
    """Ray namespace."""
    ray_log_to_driver: bool = True
    """Forward worker logs to the driver process."""
    ray_runtime_env: dict[str, Any] | None = None
    """Custom Ray runtime environment."""
    ray_disable_runtime_env_hook: bool = True
    """Disable Ray's runtime environment hook."""
    ray_pin_py_executable: bool = True
    """Pin the Python executable path in workers."""
    ray_propagate_active_venv: bool = True
    """Propagate the active virtualenv to workers."""
    ray_propagate_run_dir: bool = True
    """Propagate the run directory to workers."""
    ray_broadcast_init_timeout_s: int = Field(default=300, ge=1)
    """Timeout for weight broadcast initialization."""
    ray_broadcast_prefer_loopback_if_single_node: bool = True
    """Prefer the loopback interface for single-node broadcasts."""
    ray_shutdown_on_exit: bool = False
    """Shut down the Ray cluster on exit."""
    ray_inference_cpus_per_worker: float = Field(default=4.0, gt=0)
    """CPU cores allocated per inference worker (fractions allowed)."""
    ray_trainer_cpus_per_worker: float = Field(default=4.0, gt=0)
    """CPU cores allocated per trainer worker (fractions allowed)."""
    trainer_torch_threads: int | None = Field(default=None, ge=1)
    """torch intra-op threads per trainer rank (null = auto: with max_async_rollout 0 the trainer
    ranks share the node's cores, else ray_trainer_cpus_per_worker rounded up)."""
    inference_torch_threads: int | None = Field(default=None, ge=1)
    """torch intra-op threads per transformers-engine server (null = auto, the trainer's rule with
    ray_inference_cpus_per_worker; the engine kwarg num_threads wins)."""
    ray_inference_placement_strategy: Placement = "PACK"
    """Placement strategy for inference workers."""
    ray_trainer_placement_strategy: Placement = "PACK"
    """Placement strategy for trainer workers."""
    ray_placement_timeout_s: int = Field(default=900, ge=1)
    """Timeout for Ray placement group creation."""

    # --- Weight broadcasting -------------------------------------------------------
    weight_broadcast_mode: Literal["flattened_bucket", "per_tensor"] = "flattened_bucket"
    """Strategy for broadcasting updated weights to inference servers."""
    weight_broadcast_bucket_mb: int = Field(default=256, ge=1)
    """Bucket size in MB for flattened broadcast."""
    weight_broadcast_cpu_staging: bool = False
    """Use a CPU staging buffer for weight transfers."""
    weight_broadcast_pin_memory: bool = True
    """Use pinned CPU memory for faster H2D transfers."""
    weight_broadcast_free_grad_buffers: bool = True
    """Free Megatron gradient buffers during broadcast."""
    weight_sync_verify: bool = True
    """Fingerprint the weights on both sides of every sync; a mismatch stops the run."""

    # --- Megatron ------------------------------------------------------------------
    megatron_tensor_parallel_size: int = Field(default=1, ge=1)
    """Tensor parallelism degree."""
    megatron_pipeline_parallel_size: int = Field(default=1, ge=1)
    """Pipeline parallelism degree."""
    megatron_context_parallel_size: int = Field(default=1, ge=1)
    """Context parallelism degree."""
    megatron_expert_parallel_size: int = Field(default=1, ge=1)
    """Expert parallelism degree (MoE models)."""
    megatron_global_batch_size: int | None = Field(default=None, ge=1)
    """Global batch size. Defaults to prompts_batch_size_for_trainer."""
    megatron_disable_unified_memory_jit: bool = True
    """Disable unified memory JIT."""
    megatron_optimizer_cpu_offload: bool = False
    """Offload optimizer states to CPU."""
    megatron_optimizer_offload_fraction: float = Field(default=1.0, ge=0, le=1)
    """Fraction of optimizer state to offload. Range: [0, 1]."""
    megatron_overlap_cpu_optimizer_d2h_h2d: bool = True
    """Overlap CPU optimizer D2H/H2D transfers."""
    megatron_use_precision_aware_optimizer: bool = False
    """Use the precision-aware optimizer."""
    megatron_main_grads_dtype: Dtype = "float32"
    """Data type for main gradients."""
    megatron_main_params_dtype: Dtype = "float32"
    """Data type for main parameters."""
    megatron_exp_avg_dtype: Dtype = "float32"
    """Data type for the Adam exponential average."""
    megatron_exp_avg_sq_dtype: Dtype = "float32"
    """Data type for the Adam exponential average squared."""
    megatron_grad_reduce_in_fp32: bool = True
    """Reduce gradients in FP32. false halves grad buffer memory."""
    megatron_gradient_checkpointing: bool = True
    """Recompute activations in the backward pass."""
    megatron_sequence_parallel: bool = True
    """Shard the sequence dimension in LayerNorm/dropout (takes effect only with TP > 1)."""
    megatron_use_distributed_optimizer: bool = True
    """Shard optimizer states across DP ranks (takes effect only with DP > 1)."""
    megatron_overlap_grad_reduce: bool = False
    """Overlap gradient allreduce with backward compute."""
    megatron_use_transformer_engine: bool = False
    """Use the TransformerEngine layer spec (fused attention, FP8-ready)."""
    megatron_fp8: bool = False
    """Enable FP8 compute (requires TransformerEngine and a Hopper GPU)."""

    # --- vLLM tracing --------------------------------------------------------------
    enable_vllm_tracing: bool = True
    """Enable OpenTelemetry tracing for vLLM."""
    otlp_receiver_port: int = Field(default=4318, ge=1, le=65535)
    """OTLP HTTP receiver port. Range: [1, 65535]."""

    @field_validator("checkpoint_every")
    @classmethod
    def _checkpoint_every(cls, value: int | bool) -> int | bool:
        if value is True:
            raise ValueError(
                "true is not an interval: give the number of steps between checkpoints, or false"
            )
        if not isinstance(value, bool) and value < 0:
            raise ValueError("must be >= 0 (0 or false disables checkpointing)")
        return value

    @field_validator("resume_from_checkpoint")
    @classmethod
    def _resume(cls, value: bool | int) -> bool | int:
        if not isinstance(value, bool) and value < 0:
            raise ValueError("must be true (latest), false, or a step number >= 0")
        return value

    @model_validator(mode="after")
    def _cross_field_rules(self) -> TelescopeConfig:
        problems = _cross_field_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def num_inference_servers(self) -> int:
        """Inference servers of the run: ``inference_num_workers / inference_tensor_parallel_size``."""
        return int(self.inference_num_workers // self.inference_tensor_parallel_size)

    @property
    def resolved_run_dir(self) -> str:
        """The run directory: run_dir, or runs/<wandb_run_name>."""
        return self.run_dir or f"runs/{self.wandb_run_name}"

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (what workers and servers receive)."""
        return self.model_dump(mode="json")


def _cross_field_problems(cfg: TelescopeConfig) -> list[str]:
    """Rules of the seed docs that need no plugin registry (each names the fields and the fix)."""
    problems = []
    if cfg.inference_num_workers % cfg.inference_tensor_parallel_size:
        problems.append(
            f"inference_num_workers ({cfg.inference_num_workers}) must be divisible by "
            f"inference_tensor_parallel_size ({cfg.inference_tensor_parallel_size})"
        )
    if cfg.use_tis and cfg.use_ppo_clip and cfg.ppo_clip_ref_logprobs == "rollout":
        problems.append(
            "use_tis: true with use_ppo_clip: true and ppo_clip_ref_logprobs: rollout double-counts the "
            "importance-sampling correction; set ppo_clip_ref_logprobs: batch"
        )
    if cfg.free_lane_after_generation and not cfg.enable_individual_sample_lanes:
        problems.append(
            "free_lane_after_generation: true requires enable_individual_sample_lanes: true "
            "(set one of them accordingly)"
        )
    if cfg.lora_target_modules is not None and not cfg.lora_target_modules:
        problems.append(
            "lora_target_modules: [] names no module; list module names (e.g. [q_proj, v_proj]) "
            "or set null for the architecture's attention and MLP projections"
        )
    problems += _distill_problems(cfg)
    rollbacks = [
        name for name, value in cfg.model_dump().items() if name.startswith("health_") and value == "rollback"
    ]
    if rollbacks and not cfg.checkpoint_every:
        problems.append(
            f"{', '.join(rollbacks)}: rollback restores a checkpoint, but checkpoint_every is off; "
            "set checkpoint_every (e.g. 5) or choose stop"
        )
    for i, env in enumerate(cfg.environments):
        if env.reward_min is not None and env.reward_max is not None and env.reward_min >= env.reward_max:
            problems.append(
                f"environments[{i}] ({env.name}): reward_min ({env.reward_min}) must be below "
                f"reward_max ({env.reward_max})"
            )
    at = cfg.context_compaction_at_tokens
    if at is not None and at >= cfg.max_model_len:
        problems.append(
            f"context_compaction_at_tokens ({at}) must be below max_model_len ({cfg.max_model_len}): "
            "the summary request and the summary need room after the conversation; lower it"
        )
    return problems


def _distill_problems(cfg: TelescopeConfig) -> list[str]:
    """On-policy distillation's rules that need no registry (the algorithm's are in ``validate``)."""
    if cfg.distill_teacher_model is None:
        if cfg.distill_teacher_base_url is not None:
            return [
                f"distill_teacher_base_url: {cfg.distill_teacher_base_url} needs distill_teacher_model (the "
                "model name the endpoint serves, whose tokenizer is checked against the policy's); set it"
            ]
        return []
    problems = []
    if cfg.discard_group_zero_advantage:
        problems.append(
            "distill_teacher_model is set but discard_group_zero_advantage: true would discard groups whose "
            "rewards are equal, which still carry the teacher's per-token signal; set "
            "discard_group_zero_advantage: false"
        )
    if cfg.distill_kl_coef == 0 and cfg.distill_reward_weight == 0:
        problems.append(
            "distill_kl_coef: 0 and distill_reward_weight: 0 leave no training signal; set one of them above 0"
        )
    return problems
