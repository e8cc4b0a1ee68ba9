"""Typed configuration and its validation.

``TrainConfig`` holds every knob of one training run.  ``load_config`` merges defaults, a
YAML file and explicit overrides (CLI flags), then ``validate`` checks everything that can
be checked before anything compiles, raising ``ConfigError`` with the field name and a fix.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tclock.errors import ConfigError  # noqa: F401  (raised here; tclock.config.ConfigError for callers)


@dataclass
class TrainConfig:
    # task
    env: str = "pointmass_reach"  # task name (tclock envs lists them)
    env_kwargs: dict = field(default_factory=dict)  # keyword arguments for the task factory, e.g. {radius: 0.2}
    episode_length: int = 0  # 0: the task's registered default
    backend: str = ""  # "": the task's default physics pipeline
    # sizes (see docs/design.md §2: B = num_envs, T = unroll_length)
    num_envs: int = 256  # rollout batch size B: parallel envs per seed
    unroll_length: int = 32  # T: steps per env per rollout
    num_minibatches: int = 4  # minibatches per epoch; must divide num_envs*unroll_length
    num_epochs: int = 4  # passes over each rollout (impala defaults to 1: tclock learners)
    total_steps: int = 2_000_000  # env steps per seed
    seeds: int = 1  # seeds trained together in one program (leading vmap axis)
    seed: int = 0  # base seed; seed i of a run uses fold_in(seed, i)
    mesh: str = ""  # devices of one run: "seeds=S,envs=E" (tclock.mesh); "": all devices on envs when num_envs divides
    # learner
    algo: str = "ppo"  # learner: ppo | impala (V-trace actor-critic) | sac (off-policy, replay) | any registered one (tclock learners)
    lr: float = 1e-3  # Adam learning rate (before lr_scaling)
    lr_schedule: str = "constant"  # constant | linear | cosine, over the lr_clock's horizon
    lr_clock: str = "steps"  # steps (env steps / total_steps) | wall (seconds / total_seconds) | hybrid
    lr_scaling: str = "none"  # none | sqrt | linear | noise: the lr follows B (tclock.control.coscale; DRBS moves too)
    lr_base_envs: int = 256  # the num_envs at which lr_scaling leaves lr unchanged
    gamma: float = 0.97  # discount
    gae_lambda: float = 0.95  # GAE / HAE lambda
    clip_eps: float = 0.2  # PPO ratio clip
    ent_coef: float = 0.01  # entropy bonus weight
    vf_coef: float = 0.5  # value loss weight
    max_grad_norm: float = 0.5  # global gradient-norm clip
    vtrace_rho_bar: float = 1.0  # impala: importance-weight clip for the targets and policy gradient
    vtrace_c_bar: float = 1.0  # impala: trace-cutting clip
    vtrace_lambda: float = 1.0  # impala: V-trace lambda
    sac_batch_size: int = 256  # sac: transitions per gradient step, drawn from the replay buffer
    sac_buffer_size: int = 131072  # sac: replay capacity per seed (transitions; a ring, oldest overwritten)
    sac_min_replay: int = 4096  # sac: transitions stored (initial policy) before the first gradient step
    sac_replay_ratio: float = 0.0625  # sac: gradient steps per env step; a phase runs ratio*B*T steps
    sac_tau: float = 0.005  # sac: Polyak rate of the target critics
    sac_init_alpha: float = 0.1  # sac: initial entropy temperature (learned)
    sac_target_entropy: float = -1.0  # sac: target entropy per action dimension
    policy_hidden: tuple = (64, 64)  # policy MLP layer widths
    value_hidden: tuple = (64, 64)  # value MLP layer widths
    activation: str = "tanh"  # tanh | relu | swish
    normalize_obs: bool = True  # running mean/std observation normalisation
    reward_scale: float = 1.0  # rewards are multiplied by this before advantages
    advantage: str = "gae"  # gae | hae (hierarchical advantage estimation, write-up 4.3)
    hae_window: int = 64  # steps per window centred on a reward event
    hae_threshold: float = 0.0  # reward > threshold marks an event
    hae_combine: str = "sum"  # sum (write-up code) | reward (weighted by event reward)
    hae_outside: str = "zero"  # zero (write-up code) | gae (steps outside every window use GAE)
    hae_window_bootstrap: str = "none"  # none (write-up code) | value (bootstrap at the window's end)
    hae_max_events: int = 0  # 0: no cap; else the first N events per env column get windows
    # diagnostics (activation, advantage shape: every iteration, they cost nothing measurable)
    gdc_every: int = 8  # gradient diagnostics (GDC, noise scales, the online critical batch): every N iterations (0 = never)
    gdc_k: int = 5  # minibatch gradients per GDC estimate
    gdc_minibatch: int = 64  # transitions per GDC minibatch
    noise_groups: int = 4  # online critical batch: groups of whole env trajectories per estimate (0 = off)
    noise_env_share: float = 0.25  # share of the rollout's envs split into those groups
    noise_window: int = 20  # estimates averaged (trace and |G|^2 separately) in b_crit_online_envs
    noise_split: bool = False  # also run learning phases on two disjoint halves of the envs (discarded): the update's noise scale in envs and the step-size signal (a diagnostic iteration ~1.6-1.9x a plain one: +7-11% time at gdc_every 8; sweeps turn it on)
    # mitigations: dynamic rollout batch size (DRBS)
    drbs: bool = False
    drbs_min: int = 64
    drbs_max: int = 1024
    drbs_window: int = 20
    drbs_high: float = 0.75
    drbs_low: float = 0.35
    drbs_step: float = 0.25  # ladder spacing: 0.25 = rungs 25% apart (rt_ut: one rung per decision; critical: a move may cross several); 1.0: the write-up's first x2 / /2 version
    drbs_precompile: bool = False  # compile every ladder size before training starts
    drbs_signal: str = "critical"  # critical: steer to the online critical batch / B*; rt_ut: the write-up's ratio rule
    drbs_band: float = 1.5  # critical: hold while B is within this factor of the target either way
    drbs_timing_probe: bool = True  # critical: a start above drbs_min times drbs_min after its first iteration (t(B) at two sizes, for B*) and makes its first estimates there
    drbs_estimates: int = 3  # critical: new critical-batch estimates at a size before the next move (after a start or a move the noise is measured on every iteration until they are in)
    # mitigations: update rhythm on the wall clock (PURM)
    purm: bool = False
    purm_t_base: float = 3.0
    purm_alpha: float = 0.2
    purm_t_cycle: float = 60.0
    total_seconds: float = 0.0  # wall budget: required with purm; horizon of wall-clock lr schedules
    # mitigations: asynchronous rollout pipeline (ARP)
    arp: bool = False
    arp_actors: int = 1  # actor threads, each with its own envs (num_envs each)
    arp_capacity: int = 4  # rollouts the ring buffer holds; the oldest is evicted when full
    arp_max_age_s: float = 0.0  # drop rollouts older than this; 0: calibrate (p95 rollout latency x 1.5)
    arp_calibration_rollouts: int = 5  # rollouts timed before training to calibrate arp_max_age_s
    # run
    out: str = "runs/latest"  # run directory (sweep: the sweep directory)
    checkpoint_every: int = 20  # iterations
    keep_checkpoints: int = 3  # newest checkpoints kept; --resume falls back to an older one if the newest is damaged
    tensorboard: bool = False  # mirror every metrics.jsonl scalar to <out>/tensorboard/ (extra: tclock[tracking])
    wandb: str = ""  # W&B project to mirror the metrics to ("": off; WANDB_MODE=offline honoured; tclock[tracking])
    target_success: float = 0.5  # success rate that counts as "target reached" in sweeps
    progress: bool = True  # progress bar on stderr

    @property
    def transitions_per_rollout(self) -> int:
        return self.num_envs * self.unroll_length

    @property
    def minibatch_size(self) -> int:
        return self.transitions_per_rollout // self.num_minibatches

    @property
    def num_iterations(self) -> int:
        return max(1, self.total_steps // self.transitions_per_rollout)

    def scaled_lr(self, b_noise: float | None = None) -> float:
        """``lr`` at ``num_envs`` under ``lr_scaling`` (:func:`tclock.control.coscale.lr_multiplier`;
        ``noise`` needs the online noise scale ``b_noise`` and is 1x without it)."""
        from tclock.control.coscale import lr_multiplier

        return self.lr * lr_multiplier(self.lr_scaling, self.num_envs, self.lr_base_envs, b_noise)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["policy_hidden"] = list(self.policy_hidden)
        d["value_hidden"] = list(self.value_hidden)
        return d

    def replace(self, **changes) -> "TrainConfig":
        return coerce(dataclasses.replace(self, **changes))


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
# Fields a --resume may change (budgets and bookkeeping); a finished sweep run is reused only
# when everything but SWEEP_MAY_CHANGE matches.
RESUME_MAY_CHANGE = frozenset({"total_steps", "total_seconds", "out", "progress", "checkpoint_every",
                               "keep_checkpoints", "tensorboard", "wandb", "mesh"})
SWEEP_MAY_CHANGE = frozenset({"out", "progress", "keep_checkpoints", "tensorboard", "wandb", "mesh"})


def config_differences(saved: dict, cfg: TrainConfig, may_differ=frozenset(), limit: int = 8) -> str:
    """The fields (outside ``may_differ``) in which a saved config (a run's ``config.yaml``)
    differs from ``cfg``, as ``"field: saved X, now Y; ..."`` ("" when none).  A field the
    saved config lacks (written before the field existed) counts as its default."""
    now = cfg.to_dict()
    plain = TrainConfig().to_dict()
    diff = [k for k in now if k not in may_differ and saved.get(k, plain[k]) != now[k]]
    return "; ".join(f"{k}: saved {saved.get(k, plain[k])!r}, now {now[k]!r}" for k in diff[:limit])
_CHOICES = {
    "lr_schedule": ("constant", "linear", "cosine"),
    "lr_scaling": ("none", "sqrt", "linear", "noise"),
    "drbs_signal": ("critical", "rt_ut"),
    "activation": ("tanh", "relu", "swish"),
    "advantage": ("gae", "hae"),
    "hae_combine": ("sum", "reward"),
    "hae_outside": ("zero", "gae"),
    "hae_window_bootstrap": ("none", "value"),
    "lr_clock": ("steps", "wall", "hybrid"),
}


def _coerce_field(name: str, value: Any) -> Any:
    default = _FIELDS[name].default if _FIELDS[name].default is not dataclasses.MISSING else None
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                if value.lower() in ("true", "1", "yes", "on"):
                    return True
                if value.lower() in ("false", "0", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if isinstance(default, int):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(float(value)) if isinstance(value, str) else int(value)
        if isinstance(default, float):
            return float(value)
        if isinstance(default, str):
            return str(value)
        if isinstance(default, tuple):
            return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: cannot read {value!r} as {type(default).__name__}; "
                          f"give a {type(default).__name__} like {default!r}") from None
    return value


def coerce(cfg: TrainConfig) -> TrainConfig:
    for name in _FIELDS:
        if name != "env_kwargs":
            setattr(cfg, name, _coerce_field(name, getattr(cfg, name)))
    return cfg


def from_dict(data: dict, base: TrainConfig | None = None, source: str = "config") -> TrainConfig:
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {', '.join(unknown)}; known fields: {', '.join(sorted(_FIELDS))}")
    cfg = dataclasses.replace(base or TrainConfig())
    for k, v in data.items():
        setattr(cfg, k, v)
    return coerce(cfg)


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist; check the path given to --config")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise ConfigError(f"config file {path} is not valid YAML{at}: {getattr(e, 'problem', e)}; "
                          "fix the syntax (fields are `name: value` pairs)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of field: value, got {type(data).__name__}")
    return data


def learner_defaults(algo: str) -> dict:
    """The config values in which learner ``algo`` differs from ``TrainConfig``'s defaults
    ({} for an unknown name: ``validate`` reports it)."""
    from tclock import agents

    return dict(agents.learner_spec(algo).defaults) if algo in agents.learner_names() else {}


def defaults_for(algo: str = "ppo", **fields) -> TrainConfig:
    """``TrainConfig`` with learner ``algo``'s own defaults, then ``fields``: what
    ``tclock train --algo <algo>`` starts from.  ``TrainConfig(algo=...)`` alone keeps the
    dataclass defaults (PPO's)."""
    return from_dict({**learner_defaults(algo), "algo": algo, **fields})


def load_config(path: str | Path | None = None, overrides: dict | None = None,
                base: TrainConfig | None = None) -> TrainConfig:
    """Layers, lowest first: ``TrainConfig``'s defaults, the learner's defaults (for fields
    still at the dataclass default in ``base``), ``base``, the YAML file, ``overrides``."""
    cfg = base or TrainConfig()
    file_data = read_yaml(path) if path else {}
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    algo = str(overrides.get("algo", file_data.get("algo", cfg.algo)))
    plain = TrainConfig()
    learner = {k: v for k, v in learner_defaults(algo).items()
               if k not in file_data and k not in overrides and getattr(cfg, k) == getattr(plain, k)}
    if learner:
        cfg = from_dict(learner, cfg, source=f"{algo} defaults")
    if file_data:
        cfg = from_dict(file_data, cfg, source=str(path))
    if overrides:
        cfg = from_dict(overrides, cfg, source="command line")
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> TrainConfig:
    """Checks a config before anything compiles. Returns it, or raises ConfigError."""
    from tclock import agents, envs  # local: both import JAX and Brax, config stays light otherwise

    if cfg.env not in envs.names():
        raise ConfigError(f"env: unknown env {cfg.env!r}; choose one of: {', '.join(envs.names())}")
    if cfg.algo not in agents.learner_names():
        raise ConfigError(f"algo: {cfg.algo!r} is not one of {', '.join(agents.learner_names())} (a module passed "
                          "with --import can register more)")
    for name in ("num_envs", "unroll_length", "num_minibatches", "num_epochs", "total_steps", "seeds",
                 "checkpoint_every", "keep_checkpoints", "gdc_k", "gdc_minibatch", "lr_base_envs"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{name}: must be a positive integer, got {getattr(cfg, name)}")
    if cfg.episode_length < 0:
        raise ConfigError(f"episode_length: must be >= 0 (0 = the task's default), got {cfg.episode_length}")
    if cfg.gdc_every < 0:
        raise ConfigError(f"gdc_every: must be >= 0 (0 disables GDC), got {cfg.gdc_every}")
    for name, choices in _CHOICES.items():
        if getattr(cfg, name) not in choices:
            raise ConfigError(f"{name}: {getattr(cfg, name)!r} is not one of {', '.join(choices)}")
    n = cfg.transitions_per_rollout
    if n % cfg.num_minibatches:
        ok = [m for m in range(1, min(n, 64) + 1) if n % m == 0]
        raise ConfigError(
            f"num_minibatches: num_envs*unroll_length = {cfg.num_envs}*{cfg.unroll_length} = {n} is not divisible "
            f"by num_minibatches={cfg.num_minibatches}; pick num_minibatches from {ok[-8:]} or change num_envs")
    learner = agents.learner_spec(cfg.algo)
    if learner.validate is not None:
        learner.validate(cfg)
    if cfg.total_steps < n:
        raise ConfigError(f"total_steps: {cfg.total_steps} is less than one rollout (num_envs*unroll_length = {n}); "
                          f"raise total_steps to at least {n}")
    if cfg.gdc_every and cfg.gdc_minibatch > n:
        raise ConfigError(f"gdc_minibatch: {cfg.gdc_minibatch} exceeds the rollout's {n} transitions; "
                          f"set gdc_minibatch <= {n}")
    if cfg.gdc_every and cfg.gdc_k < 2:
        raise ConfigError(f"gdc_k: GDC needs at least 2 gradients, got {cfg.gdc_k}")
    if cfg.noise_groups < 0 or cfg.noise_groups == 1:
        raise ConfigError(f"noise_groups: the online critical batch needs >= 2 groups (0 = off), got {cfg.noise_groups}")
    if not 0.0 < cfg.noise_env_share <= 1.0:
        raise ConfigError(f"noise_env_share: must be in (0, 1], got {cfg.noise_env_share}")
    if cfg.noise_window <= 0:
        raise ConfigError(f"noise_window: must be a positive integer, got {cfg.noise_window}")
    smallest = min(drbs_ladder(cfg)) if cfg.drbs else cfg.num_envs
    if cfg.gdc_every and cfg.noise_groups and smallest < cfg.noise_groups:
        raise ConfigError(f"noise_groups: {cfg.noise_groups} groups of whole env trajectories need at least as many "
                          f"envs, but the batch can be {smallest}; lower noise_groups or raise num_envs")
    if not 0.0 < cfg.gamma <= 1.0:
        raise ConfigError(f"gamma: must be in (0, 1], got {cfg.gamma}")
    if not 0.0 <= cfg.gae_lambda <= 1.0:
        raise ConfigError(f"gae_lambda: must be in [0, 1], got {cfg.gae_lambda}")
    if cfg.lr <= 0:
        raise ConfigError(f"lr: must be positive, got {cfg.lr}")
    if cfg.hae_window < 2:
        raise ConfigError(f"hae_window: must be >= 2 steps, got {cfg.hae_window}")
    if cfg.hae_max_events < 0:
        raise ConfigError(f"hae_max_events: must be >= 0 (0 = no cap), got {cfg.hae_max_events}")
    if cfg.total_seconds < 0:
        raise ConfigError(f"total_seconds: must be >= 0, got {cfg.total_seconds}")
    if cfg.purm and cfg.total_seconds <= 0:
        raise ConfigError("total_seconds: --purm trains for a wall-clock budget; give --total-seconds (e.g. 120)")
    if cfg.lr_clock != "steps" and cfg.total_seconds <= 0:  # the clock needs its horizon, whatever the schedule
        raise ConfigError(f"total_seconds: lr_clock={cfg.lr_clock} measures progress in wall seconds and needs the "
                          "wall horizon; give --total-seconds (e.g. 120) or use --lr-clock steps")
    if cfg.drbs:
        drbs_ladder(cfg)  # raises ConfigError on an impossible ladder
        if cfg.drbs_signal == "critical" and not (cfg.gdc_every and (cfg.noise_groups or cfg.noise_split)):
            raise ConfigError("drbs_signal: critical steers by the online critical batch, which needs gdc_every >= 1 "
                              "and noise_groups >= 1 (or --noise-split); set them or use --drbs-signal rt_ut")
    if cfg.lr_scaling == "noise" and cfg.arp:
        raise ConfigError("lr_scaling: noise is applied by the synchronous loop only; use none | sqrt | linear "
                          "with --arp")
    if cfg.lr_scaling == "noise" and not (cfg.gdc_every and (cfg.noise_groups or cfg.noise_split)):
        raise ConfigError("lr_scaling: noise follows the online noise scale, which needs gdc_every >= 1 and "
                          "noise_groups >= 1 (or --noise-split); set them or pick none | sqrt | linear")
    if cfg.arp:
        if cfg.drbs or cfg.purm:
            raise ConfigError("arp: the asynchronous pipeline runs one batch size on its own clock; "
                              "turn off --drbs and --purm when using --arp")
        for name in ("arp_actors", "arp_capacity", "arp_calibration_rollouts"):
            if getattr(cfg, name) <= 0:
                raise ConfigError(f"{name}: must be a positive integer, got {getattr(cfg, name)}")
        if cfg.arp_max_age_s < 0:
            raise ConfigError(f"arp_max_age_s: must be >= 0 (0 = calibrate), got {cfg.arp_max_age_s}")
    if not cfg.policy_hidden or not cfg.value_hidden or min(cfg.policy_hidden + cfg.value_hidden) <= 0:
        raise ConfigError("policy_hidden / value_hidden: give one or more positive layer widths, e.g. [64, 64]")
    _validate_mesh(cfg)
    from tclock import tracking  # light: imports the tracking packages only to train

    tracking.check_available(cfg)
    return cfg


def _validate_mesh(cfg: TrainConfig) -> None:
    """An explicit ``--mesh`` must divide the seeds and every batch size the run takes; the device
    count is checked when the run starts (:func:`tclock.mesh.resolve`), still before compiling."""
    from tclock import mesh

    shape = mesh.parse_mesh(cfg.mesh)
    if shape is None:
        return
    if cfg.arp and shape.size > 1:
        raise ConfigError("mesh: the asynchronous pipeline places its learner and actors on devices itself; drop "
                          "--mesh or --arp")
    mesh.check_divides(shape, cfg.seeds, [cfg.drbs_max, *make_drbs_controller(cfg).ladder] if cfg.drbs
                       else [cfg.num_envs])


def ladder_multiple(cfg: TrainConfig) -> int:
    """Batch sizes must be multiples of this; the learner's registry entry says why (PPO splits
    B*unroll_length transitions into minibatches; IMPALA splits the B env sequences), and an
    explicit ``--mesh`` with ``envs=E`` adds E (each device steps the same number of envs)."""
    import math

    from tclock import agents, mesh

    shape = mesh.parse_mesh(cfg.mesh)
    return math.lcm(int(agents.learner_spec(cfg.algo).batch_multiple(cfg)), shape.envs if shape else 1)


def drbs_ladder(cfg: TrainConfig) -> tuple:
    """The DRBS controller's ladder of valid batch sizes for this config (ConfigError if none)."""
    if not cfg.drbs_min <= cfg.num_envs <= cfg.drbs_max:
        raise ConfigError(f"num_envs: with --drbs the starting batch {cfg.num_envs} must lie in "
                          f"[drbs_min={cfg.drbs_min}, drbs_max={cfg.drbs_max}]; change one of them")
    try:
        controller = make_drbs_controller(cfg)
    except ValueError as e:
        raise ConfigError(f"drbs: {e}") from None
    too_small = [b for b in controller.ladder if cfg.gdc_every and b * cfg.unroll_length < cfg.gdc_minibatch]
    if too_small:
        raise ConfigError(f"drbs_min: ladder sizes {too_small} hold fewer than gdc_minibatch={cfg.gdc_minibatch} "
                          "transitions; raise drbs_min or lower gdc_minibatch")
    return controller.ladder


def make_drbs_controller(cfg: TrainConfig):
    from tclock.control import CriticalBatchController, DRBSController

    if cfg.drbs_signal == "critical":
        return CriticalBatchController(base=cfg.num_envs, min=cfg.drbs_min, max=cfg.drbs_max, step=cfg.drbs_step,
                                       band=cfg.drbs_band, min_estimates=cfg.drbs_estimates,
                                       multiple=ladder_multiple(cfg), window=cfg.noise_window,
                                       timing_probe=cfg.drbs_timing_probe)
    return DRBSController(base=cfg.num_envs, min=cfg.drbs_min, max=cfg.drbs_max, window=cfg.drbs_window,
                          high=cfg.drbs_high, low=cfg.drbs_low, step=cfg.drbs_step, multiple=ladder_multiple(cfg))


def markdown_reference() -> str:
    """docs/config.md, generated from the field comments above (a test keeps the two equal)."""
    import inspect
    import re

    source = inspect.getsource(TrainConfig).split("    @property")[0]
    out = ["# Configuration fields", "",
           "Every field of `TrainConfig` (tclock/config.py) is a flag of `tclock train`, `tclock sweep` and",
           "`tclock profile` (`num_envs` → `--num-envs`; booleans as `--drbs` / `--no-drbs`; lists as",
           "`--policy-hidden 64 64`) and a key of a `--config` YAML file. Flags override the file.",
           "Bad values fail before anything compiles, with the field's name and a fix.",
           "Regenerate this page with `python -c \"import tclock.config as c; print(c.markdown_reference(), end='')\"`."]
    for line in source.splitlines()[1:]:
        header = re.match(r"\s+# (.*)", line)
        if header:
            out += ["", f"## {header.group(1)}", "", "| field | default | meaning |", "| --- | --- | --- |"]
            continue
        item = re.match(r"\s+(\w+): [\w\[\], ]+ = (.+?)(?:\s+#\s*(.*))?$", line)
        if item:
            name, default, comment = item.groups()
            default = default.replace("field(default_factory=dict)", "{}")
            out.append(f"| `{name}` | `{default}` | {(comment or '').replace('|', '/')} |")
    return "\n".join(out) + "\n"
