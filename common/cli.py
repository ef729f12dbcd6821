"""Config and CLI: the flags every script shares, argparse generated from a frozen dataclass,
--resume's config.

A script's `Config` subclasses `RunConfig`; each field's docstring is its
`--help` line, its name the flag (`n_samples` is `--n-samples`), and its
`__post_init__` checks values with `require`, raising `ConfigError` before
anything compiles. Its float flags enter the compiled programs as inputs
(`sweep.build`): a script computes with them and never branches on them,
but for those it names in `SWITCHES` (whose 0 switches a term off, `off`)
and `STATIC_FLOATS` (constants of the programs).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import json
import math
import types
import typing
from pathlib import Path
from typing import Callable


# ----------------------------------------------------------------------------
# Config and CLI
# ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Flags every script shares. Scripts subclass it with their own fields."""

    # float flags whose 0 switches a term off: a constant of the programs at 0, else an input
    SWITCHES = ()
    # float flags that are always constants of the programs (a change compiles them anew)
    STATIC_FLOATS = ()
    # flags added after runs were written, with the value such a run had in effect: `load_config`
    # fills them in
    LEGACY = {"normalize_reward": False, "torso": "mlp", "noise_memory": 0.0, "box_coef": 0.0}

    env: str = "CartPole-v1"
    """gymnax environment id, or package.module:name of your own (a gymnax Environment class, or a
    function returning (env, env_params))"""
    seed: int = 0
    """random seed (runs with the same seed and flags are identical)"""
    num_seeds: int = 1
    """independent seeds trained side by side in one compiled program"""
    n_devices: int = 0
    """devices to split the environments over (0: all local devices)"""
    total_steps: int = 500_000
    """environment steps to train for (per seed)"""
    eval_every: int = 50
    """greedy evaluation every this many epochs (0: only at the end)"""
    eval_episodes: int = 32
    """episodes per greedy evaluation"""
    target_return: float | None = None
    """end the run at the first evaluation (--eval-every) where every seed's greedy return reaches
    this, with a checkpoint; the summary records its epoch, env steps and seconds (unset: train for
    --total-steps)"""
    checkpoint_every: int = 50
    """save a checkpoint every this many epochs (and at the end, and on Ctrl-C or SIGTERM)"""
    keep_checkpoints: int = 3
    """checkpoints kept, the newest (--resume falls back to an older one when the newest is
    unreadable)"""
    out_dir: str = ""
    """run directory; empty: runs/SCRIPT-ENV-seedSEED-TIME"""
    resume: str = ""
    """run directory to continue from its last checkpoint, with its config.json; empty: a new run"""
    overwrite: bool = False
    """start a new run in an --out-dir that holds one, deleting that run's files (config.json,
    metrics, summary, changes, checkpoints/epoch_*.npz) and nothing else"""
    eval_only: bool = False
    """with --resume: only evaluate the saved agent"""
    track: bool = False
    """log to Weights & Biases (offline when no API key is set)"""
    wandb_project: str = "jtrax"
    """wandb project name"""
    compile_cache: bool = True
    """keep compiled programs in ~/.cache/jtrax (a run's whole programs, common/executables.py, and
    JAX's persistent compilation cache), so that a run of the same programs starts sooner"""
    coordinator: str = ""
    """multi-host: HOST:PORT of process 0, JAX's coordinator (empty: $JTRAX_COORDINATOR; neither:
    one process)"""
    num_processes: int = 0
    """multi-host: number of processes, one per host (0: $JTRAX_NUM_PROCESSES)"""
    process_id: int = -1
    """multi-host: this process in [0, num-processes); 0, the chief, alone writes (-1:
    $JTRAX_PROCESS_ID)"""
    coordinator_timeout: int = 120
    """multi-host: seconds to wait for the coordinator and for every process to join"""
    sweep: tuple[str, ...] = ()
    """in-process sweep of float flags, NAME=V1,V2,... (e.g. --sweep lr=1e-3,3e-4 ent_coef=0,0.01:
    their grid); each member trains --num-seeds seeds, all in one compiled program"""

    def __post_init__(self):
        for name, kind in typing.get_type_hints(type(self)).items():  # what JAX can compute with
            value = getattr(self, name)
            require(
                kind not in (float, float | None) or value is None or math.isfinite(value),
                f"{flag_name(name)} {value}: use a finite number",
            )
            require(
                kind is not int or abs(value) < 2**31,
                f"{flag_name(name)} {value}: too large; JAX computes "
                f"with 32-bit integers: use at most {2**31 - 1}",
            )
        require(self.num_seeds >= 1, f"--num-seeds {self.num_seeds}: use 1 or more")
        require(
            self.n_devices >= 0, f"--n-devices {self.n_devices}: use 0 (all) or a positive count"
        )
        require(self.total_steps > 0, f"--total-steps {self.total_steps}: use a positive number")
        require(self.eval_every >= 0, f"--eval-every {self.eval_every}: use 0 or more")
        require(self.eval_episodes >= 1, f"--eval-episodes {self.eval_episodes}: use 1 or more")
        require(
            self.target_return is None
            or (math.isfinite(self.target_return) and self.eval_every > 0),
            f"--target-return {self.target_return}: use a finite return, with --eval-every 1 or "
            "more (the evaluations that check it)",
        )
        require(
            self.checkpoint_every >= 1, f"--checkpoint-every {self.checkpoint_every}: use 1 or more"
        )
        require(
            self.keep_checkpoints >= 1,
            f"--keep-checkpoints {self.keep_checkpoints}: use 1 or more "
            f"(2 or more leave one to resume from if the newest is damaged)",
        )
        require(
            not self.eval_only or self.resume,
            "--eval-only needs --resume DIR (the run to evaluate)",
        )
        require(
            not (self.overwrite and self.resume),
            "--overwrite starts a new run; --resume continues one: give one of them",
        )
        # every member's flags must be valid
        for member in sweep_members(self) if self.sweep else ():
            dataclasses.replace(self, sweep=(), **member)

    def resolved(self):
        """This config with the flags it leaves unset (None) filled in from its environment's
        spaces. A script whose defaults depend on them overrides it; `run.prepare` calls it before
        anything is built, so the run's config.json and advice hold the values it used."""
        return self


@dataclasses.dataclass(frozen=True)
class TrainConfig(RunConfig):
    """Flags every algorithm has, with one meaning in all of them: the rollout's size, the discount,
    the learning-rate schedule and gradient clipping. A script's `Config` subclasses it and gives a
    field its own default by declaring it again (`num_steps: int = 512`), with its own docstring or
    this one."""

    SWITCHES = ("max_grad_norm",)  # 0: no clipping (a program without it)
    num_envs: int = 8
    """parallel environments (split over devices)"""
    num_steps: int = 128
    """steps per environment per epoch (rollout length T)"""
    gamma: float = 0.99
    """discount"""
    anneal_lr: bool = True
    """anneal every learning rate linearly to 0 over the run (false: keep them constant)"""
    max_grad_norm: float = 0.5
    """clip the gradients of each network to this global norm (0: no clipping)"""

    def __post_init__(self):
        super().__post_init__()
        for name in ("num_envs", "num_steps"):
            require(getattr(self, name) >= 1, f"{flag_name(name)} must be at least 1")
        require(0 <= self.gamma <= 1, f"--gamma {self.gamma}: use a value in [0, 1]")
        require(
            self.max_grad_norm >= 0, f"--max-grad-norm {self.max_grad_norm}: use 0 (off) or more"
        )


def float_flags(cls) -> list[str]:
    """The float flags of a config class: what `--sweep` varies and `--resume` may change. A
    script's `float | None` flag is one too: unset, it is filled in before the run builds anything
    (`RunConfig.resolved`)."""
    run_flags = {f.name for f in dataclasses.fields(RunConfig)}
    return sorted(
        k
        for k, v in typing.get_type_hints(cls).items()
        if v is float or (v == float | None and k not in run_flags)
    )


def sweep_members(config) -> list[dict]:
    """The grid of `--sweep`: one `{flag: value}` per member, in order (`[{}]` without a sweep)."""
    floats = float_flags(type(config))
    axes: dict[str, list[float]] = {}
    for item in config.sweep:
        name, _, text = item.partition("=")
        name = name.lstrip("-").replace("-", "_")
        require(bool(text), f"--sweep {item!r}: use NAME=V1,V2,..., e.g. --sweep lr=1e-3,3e-4")
        require(
            name in floats,
            f"--sweep {item!r}: {name} is not a float flag of this script; "
            f"sweep one of {', '.join(floats)}",
        )
        require(name not in axes, f"--sweep {item!r}: {name} is swept twice; give its values once")
        try:
            axes[name] = [float(v) for v in text.split(",")]
        except ValueError:
            raise ConfigError(
                f"--sweep {item!r}: {text!r} holds a value that is not a number"
            ) from None
        repeated = sorted({v for v in axes[name] if axes[name].count(v) > 1})
        require(
            not repeated,
            f"--sweep {item!r}: {', '.join(f'{v:g}' for v in repeated)} given twice, which "
            f"would train identical members; give each value once",
        )
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


# Flags that steer this invocation rather than define the run: on --resume they
# come from the command line, everything else from the run's config.json (but
# for the float flags given, see `parse_config`).
RUN_CONTROL = (
    "resume",
    "overwrite",
    "eval_only",
    "track",
    "compile_cache",
    "eval_episodes",
    "keep_checkpoints",
    "target_return",
    "n_devices",
    "coordinator",
    "num_processes",
    "process_id",
    "coordinator_timeout",
)


# Flags renamed to one vocabulary across the scripts: old name -> new name. A run directory written
# before keeps resuming (`load_config` maps its config.json); an old flag on the command line is
# refused with the new name. `no_x` -> `x` flips the value.
RENAMED = {
    "no_compile_cache": "compile_cache",
    "no_anneal_lr": "anneal_lr",
    "no_normalize_reward": "normalize_reward",
    "no_normalize_advantages": "normalize_advantages",
    "lam": "gae_lambda",
    "td_lambda": "gae_lambda",
    "policy_train_steps": "policy_steps",
    "value_train_steps": "value_steps",
    "train_steps": "update_steps",
    "update_epochs": "update_passes",  # an epoch is one rollout and its updates
    "policy_lr_schedule": "anneal_lr",  # linear: true, constant: false
    "value_lr_schedule": "anneal_lr",
}
# Flags removed because they had one possible value in the scripts that had them (actor_critic's
# replay of one epoch, skip_transformer's torso).
RETIRED = {"n_replay_epochs": 1, "torso": "mlp"}


def migrate(cls, saved: dict, where: str) -> dict:
    """A saved config's flags under the names of `RENAMED`: each old flag becomes the new one (a
    `no_x` flips, a learning-rate schedule becomes `anneal_lr`); a `RETIRED` flag at its only value
    is dropped; actor_critic's former `--noise-memory -1` becomes the value its `--loss` picked."""
    hints = typing.get_type_hints(cls)
    if saved.get("noise_memory") == -1:
        saved = {**saved, "noise_memory": 0.002 if saved.get("loss") == "ppo" else 0.0}
    out = {}
    for name, value in saved.items():
        new = RENAMED.get(name)
        if name in hints or new not in hints:
            if not (name not in hints and RETIRED.get(name, object()) == value):
                out[name] = value
            continue
        if name.startswith("no_") and isinstance(value, bool):
            value = not value
        elif name.endswith("_lr_schedule") and value in ("linear", "constant"):
            value = value == "linear"
        require(
            out.get(new, value) == value,
            f"{where} sets {flag_name(name)} against the other flag that became {flag_name(new)} "
            f"({json.dumps(saved)}); give both the same value, or start a new run",
        )
        out[new] = value
    return out


class ConfigError(ValueError):
    """A flag value (or a combination, or a saved run's config.json) this project refuses; its
    message says what to use instead. `main` prints it as one line; any other exception is a bug and
    shows its traceback."""


def require(ok: bool, message: str) -> None:
    """Raises `ConfigError(message)` unless `ok`."""
    if not ok:
        raise ConfigError(message)


def require_non_negative(config, *names: str) -> None:
    """Coefficients (of a loss term, an entropy bonus): 0 (the term off) or more; unset (None)
    until `RunConfig.resolved` fills it in."""
    for name in names:
        require(
            getattr(config, name) is None or getattr(config, name) >= 0,
            f"{flag_name(name)} {getattr(config, name)}: use 0 (off) or more",
        )


def off(value) -> bool:
    """Whether a `SWITCHES` flag's term is off: its value is 0 (a number; an input of the programs
    is never 0)."""
    return isinstance(value, (int, float)) and value == 0


def field_docs(cls) -> dict[str, str]:
    """Attribute docstrings (the string after each field) of a dataclass and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(inspect.getsource(klass).lstrip())
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
            ):
                docs[node.target.id] = str(nxt.value.value).strip()
    return docs


def _is_union(kind) -> bool:
    """Whether a field's type is `X | None`: `float | None` is a types.UnionType, `Literal[...] |
    None` a typing.Union."""
    return typing.get_origin(kind) in (types.UnionType, typing.Union)


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _list_of(item: type) -> Callable:
    """Parses `64` or a list as Python prints it, `[64, 64]`, into a list of `item` (str: as
    given)."""

    def parse(text: str) -> list:
        if item is str:
            return [text]
        try:
            return [
                item(part)
                for part in text.replace("[", " ").replace("]", " ").replace(",", " ").split()
            ]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {item.__name__} values, got {text!r}"
            ) from None

    return parse


class _Once(argparse.Action):
    """Stores a flag's value; a flag given twice is an error (which of the two was meant?)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if self.dest in parser.given:
            also = (
                ""
                if parser.given[self.dest] == option_string
                else f" (also as {parser.given[self.dest]})"
            )
            parser.error(f"{option_string} is given twice{also}; give it once")
        parser.given[self.dest] = option_string
        setattr(namespace, self.dest, values)


class _Negate(_Once):
    """`--no-x`: sets the boolean `x` to false."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, False, option_string)


class _Renamed(argparse.Action):
    """A flag renamed in `RENAMED`: refused with its new name."""

    def __call__(self, parser, namespace, values, option_string=None):
        new = flag_name(RENAMED[self.dest.removeprefix("renamed_")])
        hint = " true or false" if self.dest.endswith("_lr_schedule") else ""
        parser.error(f"{option_string} is now {new}{hint} (one name across the scripts)")


class _Concatenate(_Once):
    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(
            parser, namespace, tuple(x for value in values for x in value), option_string
        )


class _Parser(argparse.ArgumentParser):
    """argparse, whose error is the one line that matters (not the usage block of every flag before
    it)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (--help lists every flag)\n")


def build_parser(cls, description: str) -> argparse.ArgumentParser:
    parser = _Parser(
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="A boolean flag takes --x, --x true, --x false, --x=False and --no-x.",
    )
    parser.given = {}  # field -> the flag that set it, as parsed
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    # --help lists the algorithm's own flags first, then those of RunConfig
    own = parser.add_argument_group("the algorithm's flags")
    shared = parser.add_argument_group(
        "run flags, the same in every script (task, budget, seeds, evaluation, outputs, devices, "
        "hosts)"
    )
    run_flags = {f.name for f in dataclasses.fields(RunConfig)}
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.name in run_flags):
        kind = hints[f.name]
        if _is_union(kind):  # `float | None`: None unless given
            kind = next(k for k in typing.get_args(kind) if k is not type(None))
        if kind is bool:  # `--flag` or `--flag=True/False` (as a wandb agent passes it)
            spec = dict(type=_parse_bool, nargs="?", const=True, metavar="BOOL", action=_Once)
        elif typing.get_origin(kind) is typing.Literal:
            spec = dict(choices=typing.get_args(kind), action=_Once)
        # `--hidden 64 64` or `--hidden=[64, 64]` (a wandb agent)
        elif typing.get_origin(kind) is tuple:
            item = typing.get_args(kind)[0]
            spec = dict(
                type=_list_of(item), nargs="+", action=_Concatenate, metavar=item.__name__.upper()
            )
        else:
            spec = dict(type=kind, metavar=kind.__name__.upper(), action=_Once)
        (shared if f.name in run_flags else own).add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f.name,
            default=f.default,
            help=docs.get(f.name, f.name),
            **spec,
        )
        if "_" in f.name:  # snake_case alias, hidden from --help
            parser.add_argument(f"--{f.name}", dest=f.name, help=argparse.SUPPRESS, **spec)
        if kind is bool:  # --no-x, hidden from --help (the epilog says it)
            for name in {f"--no-{f.name.replace('_', '-')}", f"--no_{f.name}"}:
                parser.add_argument(name, dest=f.name, action=_Negate, help=argparse.SUPPRESS)
    fields = {f.name for f in dataclasses.fields(cls)}
    for old, new in RENAMED.items():
        if new in fields and old not in fields and f"no_{new}" != old:
            for name in {f"--{old.replace('_', '-')}", f"--{old}"}:
                parser.add_argument(
                    name,
                    dest=f"renamed_{old}",
                    nargs="?",
                    action=_Renamed,
                    default=argparse.SUPPRESS,
                    help=argparse.SUPPRESS,
                )
    return parser


def parse_config(cls, argv=None, description: str = ""):
    """Config from the command line; a bad value exits with its message, before any compile.

    With `--resume DIR`: the flags of DIR's config.json, the run-control flags of
    this command line (`RUN_CONTROL`), and the float flags it gives (learning
    rates, coefficients: they change no shape of the state; `train` records the
    change). Any other flag given with a value other than the run's is refused.
    """
    parser = build_parser(cls, description)
    args = vars(parser.parse_args(argv))
    try:
        if args["resume"]:
            saved = load_config(cls, Path(args["resume"]))
            changed = {
                k: args[k]
                for k in parser.given
                if k not in RUN_CONTROL and args[k] != getattr(saved, k)
            }
            fixed = [k for k in changed if k not in float_flags(cls)]
            takes = map(
                flag_name,
                float_flags(cls) + [k for k in RUN_CONTROL if k not in ("resume", "overwrite")],
            )
            require(
                not fixed,
                f"--resume {args['resume']} continues that run with the flags of its config.json; "
                f"it cannot change {', '.join(map(flag_name, fixed))}: start a new run for "
                f"that. --resume takes the float flags and run flags: {', '.join(takes)}",
            )
            swept = [k for k in changed if any(k in member for member in sweep_members(saved))]
            require(
                not swept,
                f"--resume {args['resume']}: {', '.join(map(flag_name, swept))} is swept in that "
                f"run (--sweep {' '.join(saved.sweep)}), each member at its own value; resume "
                f"without it, or start a new run to sweep other values",
            )
            config = dataclasses.replace(
                saved, **{k: args[k] for k in RUN_CONTROL}, **changed, out_dir=args["resume"]
            )
        else:
            config = cls(**args)
    except ConfigError as error:
        parser.error(str(error))
    return config


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def load_config(cls, run_dir: Path):
    path = run_dir / "config.json"
    if not path.is_file():
        raise ConfigError(
            f"--resume {run_dir}: no config.json there; pass the directory of an earlier run"
        )
    try:
        saved = json.loads(path.read_text(errors="replace"))
    except ValueError as error:
        raise ConfigError(
            f"--resume {run_dir}: {path} is not JSON ({error}); repair it or start a new run"
        ) from None
    require(
        isinstance(saved, dict),
        f"--resume {run_dir}: {path} holds no flags ({type(saved).__name__}); "
        f"repair it or start a new run",
    )
    saved = migrate(cls, saved, f"--resume {run_dir}: {path}")
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(saved) - set(hints))
    require(
        not unknown,
        f"--resume {run_dir}: {path} has flags this script does not know "
        f"({', '.join(unknown)}); was it written by another script?",
    )
    saved = {**{k: v for k, v in cls.LEGACY.items() if k in hints}, **saved}
    missing = sorted(set(hints) - set(saved) - set(RUN_CONTROL))
    require(
        not missing,
        f"--resume {run_dir}: {path} lacks {', '.join(missing)}; add them (this script's defaults: "
        f"{', '.join(f'{k}: {json.dumps(getattr(cls, k))}' for k in missing)}) or start a new run",
    )
    for name, value in saved.items():
        require(
            _fits(hints[name], value),
            f"--resume {run_dir}: {path} sets {name} to {json.dumps(value)}, "
            f"not {_describe(hints[name])}; repair it or start a new run",
        )
    try:
        return cls(
            **{
                k: tuple(v) if isinstance(v, list) else float(v) if hints[k] is float else v
                for k, v in saved.items()
            }
        )
    except ConfigError as error:  # a value the file holds, not one given on this command line
        raise ConfigError(
            f"--resume {run_dir}: {path} holds a value this script refuses ({error}); repair the "
            f"file or start a new run"
        ) from None


def _fits(kind, value) -> bool:
    """Whether a JSON value is one of `kind`: bool, int, float (an int too), str, a Literal,
    tuple[X, ...], X | None."""
    if _is_union(kind):
        return any(_fits(k, value) for k in typing.get_args(kind))
    if typing.get_origin(kind) is typing.Literal:
        return value in typing.get_args(kind)
    if typing.get_origin(kind) is tuple:
        return isinstance(value, list) and all(_fits(typing.get_args(kind)[0], x) for x in value)
    if isinstance(value, bool) or kind is bool:
        return isinstance(value, bool) and kind is bool
    return isinstance(value, (int, float) if kind is float else kind)


def _describe(kind) -> str:
    if typing.get_origin(kind) is typing.Literal:
        return "one of " + ", ".join(map(json.dumps, typing.get_args(kind)))
    if typing.get_origin(kind) is tuple:
        return f"a list of {typing.get_args(kind)[0].__name__}"
    if _is_union(kind):
        return " or ".join(map(_describe, typing.get_args(kind)))
    return "null" if kind is type(None) else f"a {kind.__name__}"
