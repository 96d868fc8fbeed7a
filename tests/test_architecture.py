"""The package's structure, read from its source: no import cycle, every room imports
only the rooms below it, no stage receives a whole trainer (each gets the few objects
it uses: Runtime, Policy, Rollouts, a suite, a config), and nothing in agents/ receives
the run's config or its Rollouts (a rollout source gets a RolloutPort)."""
import ast
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "agentjax"

# Lowest first: a room may import its own modules and those of the rooms before it.
# One room a tier, so two rooms that import each other always fail: an env's suite uses
# the env-agnostic data and the rewards, which both use the action parsers.
TIERS = [("config",), ("core",), ("parsers",), ("models",), ("rl",), ("engine",), ("endpoint",),
         ("data",), ("rewards",), ("envs",), ("agents",), ("sglang",), ("train",), ("sweep",)]
# The one arrow downward: trajectories are built from the chat template's exact token
# ids (`Trajectory.from_demonstration`, `observation_token_ids`, `tool_turn_ids`).
ALLOWED_UPWARD = {("core.trajectory", "models.tokenizer"), ("core.trajectory", "models.chat")}


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = ast.parse(path.read_text())
    return out


def _imports(modules: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Module -> the agentjax modules it imports (anywhere in the file)."""
    edges = collections.defaultdict(set)
    for name, tree in modules.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agentjax"):
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    edges[name].add(target if target in modules else node.module)
            elif isinstance(node, ast.Import):
                edges[name].update(a.name for a in node.names if a.name.startswith("agentjax"))
    return edges


def _room(module: str) -> str:
    """The folder under agentjax/ a module lives in ("(top)" for agentjax/__init__.py)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (ROOT / parts[1]).is_dir() else "(top)"


def _tier(room: str) -> int:
    for index, rooms in enumerate(TIERS):
        if room in rooms:
            return index
    return -1  # agentjax/__init__.py: the version, importable by every room


def test_no_import_cycle():
    edges = _imports(_modules())
    state, stack, cycles = {}, [], []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module)
    assert cycles == []


def test_every_room_imports_only_the_rooms_below_it():
    upward = []
    for module, targets in _imports(_modules()).items():
        for target in targets:
            source_room, target_room = _room(module), _room(target)
            pair = (module.removeprefix("agentjax."), target.removeprefix("agentjax."))
            if _tier(target_room) > _tier(source_room) and pair not in ALLOWED_UPWARD:
                upward.append(f"{module} -> {target}")
    assert sorted(upward) == []


def test_every_room_is_in_a_tier():
    rooms = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert rooms == {room for tier in TIERS for room in tier}


def test_no_stage_takes_a_whole_trainer():
    found = []
    for module, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "Trainer":
                found.append(f"{module}: class Trainer")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(a.arg == "trainer" for a in arguments):
                    found.append(f"{module}.{node.name}(trainer, ...)")
    assert found == []


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    args = node.args
    extra = [a for a in (args.vararg, args.kwarg) if a is not None]
    return [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs + extra]


def test_nothing_in_agents_takes_the_config_or_the_rollouts():
    """What imports cannot show: a function handed the whole config or the train-level
    Rollouts reaches up into train/ at run time."""
    found = []
    for module, tree in _modules().items():
        if _room(module) != "agents":
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                taken = {"config", "rollouts"} & set(_parameters(node))
                name = getattr(node, "name", "<lambda>")
                found += [f"{module}.{name}({arg}, ...)" for arg in sorted(taken)]
    assert found == []
