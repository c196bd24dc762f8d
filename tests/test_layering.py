"""The import rules of docs/design.md ("What each module must not import"), as a test.

Reads every module of `launcher/` with `ast` (nothing is imported, so the test
takes milliseconds and needs no extra tool), builds the graph of imports
between launcher modules, and checks each rule. Imports inside functions count:
a lazy import still brings the module in when the function runs. Importing
`launcher.a.b` counts as importing `launcher.a` and `launcher` too (Python runs
their `__init__`). "Must not import" rules are checked transitively: `plan`
importing a module that imports `transport` breaks "plan is pure".

A broken rule fails `test_import_rule[<rule>]` with the rule's name, the
offending line, the chain of imports and the reason for the rule.
"""

from __future__ import annotations

import ast
import functools
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DESIGN = "docs/design.md, section \"What each module must not import\""


@dataclass(frozen=True)
class Rule:
    name: str
    sources: tuple[str, ...]  # module prefixes the rule applies to
    reason: str
    # Either the launcher modules that must not be reached (transitively)...
    forbidden: tuple[str, ...] = ()
    # ...or the only launcher modules that may be imported directly (None: no
    # such restriction). `launcher` in `allowed` means the package itself,
    # with only the names in `allowed_names` (empty: any name of it).
    allowed: tuple[str, ...] | None = None
    allowed_names: frozenset[str] = field(default_factory=frozenset)
    no_imports_at_all: bool = False
    # The module is being built on another branch (issue 11): checked once it exists.
    optional: bool = False


# launcher/agent/: every part but its entry point (main, __main__) and package init.
AGENT_PARTS = ("bundle", "commands", "files", "hostfacts", "lease", "leftovers", "protocol",
               "seal", "spawn", "stacks", "standbys", "tasks", "profiles", "health",
               "memcopy", "peercopy", "publish", "saveorder", "listening", "evidence")

RULES = (
    Rule("runtime is shipped", ("launcher.runtime", "launcher.bootstrap", "launcher.standby",
                                "launcher.podstart"),
         allowed=("launcher.runtime", "launcher.bootstrap", "launcher.standby", "launcher.strategy",
                  "launcher"),
         allowed_names=frozenset({"__version__", "runtime", "strategy"}),
         reason="the runtime and the bootstrap run inside the training process on the "
         "worker hosts, shipped there with the agent; the launcher side (config, plan, "
         "transport, supervisor, cli, with pydantic, yaml and paramiko behind them) is "
         "neither shipped nor installed on the hosts"),
    Rule("agent is standalone", ("launcher.agent",),
         allowed=("launcher", "launcher.agent", "launcher.bootstrap", "launcher.netif",
                  "launcher.outlines", "launcher.proctree", "launcher.standby",
                  "launcher.firewall", "launcher.fwrules", "launcher.hostruns",
                  "launcher.strategy"),
         allowed_names=frozenset({"__version__", "firewall", "fwrules"}),
         reason="the agent's parts (launcher/agent/) run on every host from the shipped "
         "bundle with `python -S`, standard library only; nothing of the launcher side "
         "(config, plan, supervisor, ...) is shipped, and every import costs start-up time "
         "once per host (the bootstrap is shipped too: the agent reads the stack signal's "
         "name from it)"),
    Rule("agent package init is import-free", ("launcher.agent",), no_imports_at_all=True,
         reason="launcher/agent/__init__.py runs before every part of the agent (and "
         "before `python -m launcher.agent`): it lists the parts, and imports nothing"),
    Rule("the agent's wire stands alone", ("launcher.agent.protocol",), allowed=(),
         reason="launcher/agent/protocol.py is the agent's side of the messages (events "
         "written, commands' fields checked, bounds): it depends on no other part"),
    Rule("the agent's parts are wired from its main",
         tuple(f"launcher.agent.{part}" for part in AGENT_PARTS),
         forbidden=("launcher.agent.main", "launcher.agent.__main__"),
         reason="launcher/agent/main.py builds the parts and hands each the others it "
         "needs through its constructor; a part that imported main would close a cycle"),
    Rule("interfaces are standard library", ("launcher.netif",), allowed=(),
         reason="launcher/netif.py is shipped with the agent, which reports the host's "
         "interfaces in its hello: it runs with `python -S` on every host"),
    Rule("firewall rules are standard library", ("launcher.firewall",),
         allowed=("launcher", "launcher.nftlink", "launcher.fwregistry", "launcher.fwrules"),
         allowed_names=frozenset({"nftlink", "fwregistry"}),
         reason="launcher/firewall.py is shipped with the agent, which installs the job's "
         "firewall rules on each host: it runs with `python -S` on every host; nftlink "
         "sends its nftables table over netlink, fwregistry keeps its machine's entries"),
    Rule("the firewall's rendering is standard library", ("launcher.fwrules",), allowed=(),
         reason="launcher/fwrules.py renders the rules the agent installs (and the plan "
         "makes): shipped with the agent, it runs with `python -S` on every host"),
    Rule("the firewall's registry is standard library", ("launcher.fwregistry",), allowed=(),
         reason="launcher/fwregistry.py is shipped with the agent (the tables installed on "
         "this machine, for the sweep): it runs with `python -S` on every host"),
    Rule("nftables over netlink is standard library", ("launcher.nftlink",), allowed=(),
         reason="launcher/nftlink.py is shipped with the agent (firewall's nftables "
         "transactions): it runs with `python -S` on every host"),
    Rule("host run retention is standard library", ("launcher.hostruns",), allowed=(),
         reason="launcher/hostruns.py is shipped with the agent, which prunes old run "
         "folders when it starts: it runs with `python -S` on every host"),
    Rule("process trees are standard library", ("launcher.proctree",), allowed=(),
         reason="launcher/proctree.py is shipped with the agent, which tracks every "
         "task's process tree with it: it runs with `python -S` on every host"),
    Rule("output lines are standard library", ("launcher.outlines",), allowed=(),
         reason="launcher/outlines.py is shipped with the agent, which cuts every task's "
         "output into lines with it: it runs with `python -S` on every host"),
    Rule("package init is import-free", ("launcher",), no_imports_at_all=True,
         reason="launcher/__init__.py is shipped to the hosts and runs before every "
         "import of the agent, bootstrap and runtime"),
    Rule("YAML reading stands alone", ("launcher.spec.yamldoc",), allowed=(),
         reason="the safe YAML reader under config: it knows YAML, not the cluster file"),
    Rule("strategy names stand alone", ("launcher.strategy",), allowed=(),
         reason="the strategies' names and properties are compared by config, plan, "
         "supervisor, the operator's commands and the shipped runtime: they depend on "
         "nothing and are shipped to the hosts (standard library only)"),
    Rule("transports are a table", ("launcher.spec.transports",), allowed=(),
         reason="the transports' names and what each is (simulated? an allocation? SSH?) are "
         "asked by config, plan, the transports, the launch, the operator's commands and the "
         "cli: the table depends on nothing (docs/design.md, \"A new transport\")"),
    Rule("failure kinds are a table", ("launcher.job.record.failkinds",), allowed=(),
         reason="the failure kinds' names and what each is (secondary? stuck? preempted?) "
         "are asked by the detectors, the supervisor, the teardown, the restart rules and "
         "the views: the table depends on nothing (docs/design.md, \"A new failure kind\")"),
    Rule("config comes first", ("launcher.spec.config", "launcher.spec.hosts",
                                "launcher.spec.problems", "launcher.spec.redact",
                                "launcher.spec.strict", "launcher.spec.outlets"),
         allowed=("launcher.spec.yamldoc", "launcher.strategy", "launcher.spec.hosts",
                  "launcher.spec.problems", "launcher.spec.redact", "launcher.spec.strict",
                  "launcher.spec.outlets", "launcher.spec.transports"),
         reason="the data flows one way, config -> plan -> transport/agent -> supervisor "
         "-> cli; the cluster file's schema depends on nothing else of the launcher"),
    Rule("plan is pure", ("launcher.spec.plan",),
         forbidden=("launcher.transport", "launcher.job.run.supervisor", "launcher.cli"),
         reason="build_plan is a pure function of the config (no file, socket or "
         "environment variable): --dry-run prints it and golden tests pin it; hosts and "
         "the run-time loop come after it in the flow"),
    Rule("transport is below the supervisor", ("launcher.transport",),
         forbidden=("launcher.job.run.supervisor", "launcher.cli"),
         reason="transports only hand AgentLinks up; they never decide restart policy, "
         "print final messages or turn errors into exit codes"),
    Rule("supervisor is below the cli", ("launcher.job.run.supervisor", "launcher.job.run.runner"),
         forbidden=("launcher.cli",),
         reason="outcomes are values (RunResult): only the cli turns them into text and "
         "exit codes"),
    Rule("the launch is below the cli", ("launcher.job.run.launch", "launcher.job.run.sequence",
                                         "launcher.job.run.reach", "launcher.transport.factory"),
         forbidden=("launcher.views", "launcher.commands", "launcher.cli"),
         reason="a launch returns values or raises (RunResult, Outcome, LaunchRefused); it "
         "speaks through the Voice it is handed, and only the cli prints, owns the signals "
         "and turns outcomes into exit codes"),
    Rule("reaching hosts never trains", ("launcher.job.run.reach",),
         forbidden=("launcher.job.run.supervisor", "launcher.job.run.launch"),
         reason="`check` reaches the hosts through the launch's own steps (addresses, "
         "plan, connect, hellos) and must never start a job"),
    Rule("check's probes are text", ("launcher.commands.check_scripts",), allowed=(),
         reason="the scripts `check` runs on the hosts with their Python: standard "
         "library only, nothing of the launcher side is there"),
    Rule("check never trains", ("launcher.commands.check", "launcher.commands.check_verdict",
                                "launcher.job.run.check_collective"),
         forbidden=("launcher.job.run.supervisor",),
         reason="`mgpu-launch check` talks to the agents directly and never starts a job"),
    Rule("export is offline", ("launcher.tools.export", "launcher.tools.export_trainjob",
                               "launcher.commands.export"),
         forbidden=("launcher.job.run.supervisor", "launcher.transport", "launcher.cli"),
         reason="export translates the cluster file into a Slurm script or a TFJob "
         "without reaching any host"),
    Rule("the story is values", ("launcher.job.record.events", "launcher.job.record.eventbase",
                                 "launcher.job.record.training_events"),
         forbidden=("launcher.job.run.supervisor", "launcher.transport", "launcher.views",
                    "launcher.commands", "launcher.cli"),
         reason="every view reads the events; the events know none of them"),
    Rule("the goodput ledger is a function of the story", ("launcher.job.record.goodput",),
         forbidden=("launcher.job.run.supervisor", "launcher.transport", "launcher.views",
                    "launcher.commands", "launcher.cli"),
         reason="summary.json and status compute the ledger from the same events"),
    Rule("the run's model is a fold of the story",
         ("launcher.job.record.story", "launcher.job.record.timeline"),
         forbidden=("launcher.job.run.supervisor", "launcher.job.run.launch",
                    "launcher.transport", "launcher.views", "launcher.commands", "launcher.cli"),
         reason="every view renders the one model folded from the events; summary.json is "
         "written by the launch (job floor), so the fold sits on that floor, below the views"),
    Rule("words come from events", ("launcher.views.narrate",),
         forbidden=("launcher.job.run.supervisor", "launcher.transport", "launcher.cli"),
         reason="a line is an event in words, nothing more"),
    Rule("records are read-only", ("launcher.views.records", "launcher.commands.status",
                                   "launcher.commands.logs"),
         forbidden=("launcher.job.run.supervisor", "launcher.transport", "launcher.cli"),
         reason="a run directory is data: `status` and `logs` read it without a launcher"),
    Rule("the report is read-only", ("launcher.views.report", "launcher.views.report_html",
                                     "launcher.commands.report"),
         forbidden=("launcher.job.run.supervisor", "launcher.transport", "launcher.cli"),
         reason="`mgpu-launch report` reads a run directory, finished or still going, "
         "without a launcher, and writes one file"),
    Rule("one root cause's words", ("launcher.views.rootcause",), allowed=(),
         reason="the terminal's last words, status and the report say a root cause "
         "from one pure function of the failure's JSON"),
    Rule("charts are pure", ("launcher.views.svg",), allowed=(),
         reason="the report's charts are functions from values to SVG text"),
    Rule("the live view only reads rows", ("launcher.views.live",),
         forbidden=("launcher.job.run.supervisor", "launcher.cli", "launcher.transport"),
         reason="live.render is pure over TaskRow snapshots; the supervisor drives it"),
    Rule("the printer is below the supervisor", ("launcher.outlets.printer",),
         forbidden=("launcher.job.run.supervisor", "launcher.cli"),
         reason="the supervisor thread owns the printer, not the other way round"),
    Rule("simulated hosts stand alone", ("launcher.tools.sshsim",),
         forbidden=("launcher.transport", "launcher.job.run.supervisor", "launcher.cli"),
         reason="`simulate` is also the SSH tests' fixture: it must not depend on the "
         "transport it is used to test"),
    Rule("views beside the terminal only read the story",
         ("launcher.views.metrics", "launcher.views.notify", "launcher.outlets.status_watch"),
         forbidden=("launcher.job.run.supervisor", "launcher.transport", "launcher.cli"),
         reason="metrics, notifications and `status --watch` are told the events (or read "
         "events.jsonl): they never drive the job, and `--watch` needs no launcher"),
    Rule("outlets only carry what the views render", ("launcher.outlets.metrics",
                                                      "launcher.outlets.notify"),
         forbidden=("launcher.job.run.supervisor", "launcher.transport", "launcher.cli"),
         reason="the metrics' server and textfile carry the views' renderings out of the "
         "process: they are told the events, never drive the job"),
    Rule("drill verdicts are values", ("launcher.views.drill_report",),
         forbidden=("launcher.job.run.supervisor", "launcher.transport", "launcher.cli"),
         reason="the drill's verdicts, checkpoint interval and report are pure over what "
         "it observed: tested without a job"),
    Rule("run control is beside the supervisor", ("launcher.commands.control",), optional=True,
         forbidden=("launcher.job.run.supervisor", "launcher.transport", "launcher.cli"),
         reason="`--detach` and `stop RUN_DIR` signal a launcher process and read its run "
         "directory; they never drive a job themselves"),
    Rule("traces are asked beside the supervisor", ("launcher.job.run.profiling",),
         forbidden=("launcher.job.run.supervisor", "launcher.views", "launcher.commands",
                    "launcher.cli"),
         reason="the supervisor drives a capture from its thread (and the straggler radar "
         "may too); a capture asks the agents through the links it is handed"),
    Rule("profile asks through the run directory", ("launcher.commands.profile",),
         forbidden=("launcher.job.run.supervisor", "launcher.transport", "launcher.cli"),
         reason="`mgpu-launch profile RUN_DIR` leaves a request in the run directory for the "
         "running launcher and reads its answer there; it never reaches a host itself"),
)


@dataclass(frozen=True)
class Floor:
    name: str
    modules: tuple[str, ...]  # module prefixes on this floor
    holds: str  # what is on it, for the message


# The packages in the order the data flows (docs/design.md, "Packages in flow
# order"): a module may import its own floor and the floors below it, never one
# above. The shipped modules are the ground floor: they run on the hosts and
# import nothing of the launcher side (their own rules above say what they may).
FLOORS = (
    Floor("shipped", ("launcher", "launcher.agent", "launcher.bootstrap", "launcher.podstart",
                      "launcher.standby",
                      "launcher.runtime", "launcher.netif", "launcher.firewall",
                      "launcher.fwrules", "launcher.nftlink", "launcher.fwregistry",
                      "launcher.hostruns", "launcher.proctree", "launcher.outlines",
                      "launcher.strategy"),
          "what runs on the hosts (agent, bootstrap, runtime and their standard-library "
          "helpers)"),
    Floor("spec", ("launcher.spec",),
          "what is decided before anything runs: the cluster file, addresses, the Slurm "
          "allocation, the plan, the host targets, the run directory's layout"),
    Floor("transport", ("launcher.transport",), "how the launcher reaches one agent per host"),
    Floor("job", ("launcher.job",), "a job's supervision: the launch, the decisions, the "
          "events of its story"),
    Floor("views", ("launcher.views",), "pure renderings of the run for the operator's "
          "outlets (terminal, status, report, metrics, notifications), each a reader of what "
          "the floors below decide"),
    Floor("outlets", ("launcher.outlets",), "the I/O around the views' renderings: the "
          "threads, the metrics' HTTP server and textfile, the notifications' commands, "
          "the outlets of a launch made from the cluster file"),
    Floor("tools", ("launcher.tools",), "what is not the launch path: simulated SSH hosts "
          "(also the SSH tests' fixture), the translations to Slurm and Kubernetes"),
    Floor("commands", ("launcher.commands",), "the command entry points (argv -> one call "
          "-> text -> exit code) and what only a command uses"),
    Floor("cli", ("launcher.cli", "launcher.__main__"), "argument parsing, text and exit codes"),
)
FLOORS_DESIGN = "docs/design.md, section \"Packages in flow order\""


def floor_of(module: str) -> int | None:
    """The index of `module`'s floor (the longest matching prefix wins)."""
    best, best_len = None, -1
    for index, floor in enumerate(FLOORS):
        for prefix in floor.modules:
            exact = prefix == "launcher"
            if (module == prefix or (not exact and module.startswith(prefix + "."))) \
                    and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def floor_violations(root: Path = REPO) -> dict[str, list[str]]:
    """For each floor, one message per import that runs up to a higher floor."""
    found: dict[str, list[str]] = {f.name: [] for f in FLOORS}
    for source, edges in import_graph(root).items():
        here = floor_of(source)
        for edge in edges:
            there = floor_of(edge.target)
            if here is None or there is None or there <= here:
                continue
            found[FLOORS[here].name].append(
                f"{edge.path}:{edge.line}: {source} ({FLOORS[here].name}) imports "
                f"{edge.target} ({FLOORS[there].name}, a floor above) ({edge.text})")
    return {name: sorted(set(problems)) for name, problems in found.items()}


@dataclass(frozen=True)
class Edge:
    target: str  # a launcher module
    names: tuple[str, ...]  # for `from X import a, b`: (a, b); else ()
    path: str  # file, relative to the repository
    line: int
    text: str  # the import statement as written


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def launcher_modules(root: Path) -> dict[str, Path]:
    return {module_name(root, p): p for p in sorted((root / "launcher").rglob("*.py"))}


def _is_package(modules: dict[str, Path], name: str) -> bool:
    return name in modules and modules[name].name == "__init__.py"


def import_edges(root: Path, modules: dict[str, Path], name: str) -> list[Edge]:
    """Every import of a launcher module by module `name`, anywhere in its file."""
    path = modules[name]
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    package = name if _is_package(modules, name) else name.rpartition(".")[0]
    rel = str(path.relative_to(root))
    edges = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        text = ast.unparse(node)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "launcher" or alias.name.startswith("launcher."):
                    edges += _with_parents(alias.name, (), rel, node.lineno, text)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == "launcher" or target.startswith("launcher.")):
                continue
            names = tuple(a.name for a in node.names)
            edges += _with_parents(target, names, rel, node.lineno, text)
            for sub in names:  # `from launcher import runtime` imports a module
                if f"{target}.{sub}" in modules:
                    edges.append(Edge(f"{target}.{sub}", (), rel, node.lineno, text))
    return edges


@functools.cache
def import_graph(root: Path) -> dict[str, list[Edge]]:
    modules = launcher_modules(root)
    return {name: import_edges(root, modules, name) for name in modules}


def _with_parents(target: str, names: tuple[str, ...], rel: str, line: int,
                  text: str) -> list[Edge]:
    parts = target.split(".")
    edges = [Edge(target, names, rel, line, text)]
    edges += [Edge(".".join(parts[:i]), (), rel, line, text) for i in range(1, len(parts))]
    return edges


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _applies(rule: Rule, module: str) -> bool:
    if rule.no_imports_at_all or rule.sources == ("launcher",):
        return module in rule.sources
    return _within(module, rule.sources)


def violations(rule: Rule, root: Path = REPO) -> list[str]:
    """One message per broken import (empty when the rule holds)."""
    modules = launcher_modules(root)
    graph = import_graph(root)
    problems = []
    for source in (m for m in modules if _applies(rule, m)):
        if rule.no_imports_at_all:
            tree = ast.parse(modules[source].read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    rel = modules[source].relative_to(root)
                    problems.append(f"{rel}:{node.lineno}: imports something "
                                    f"({ast.unparse(node)})")
            continue
        if rule.allowed is not None:
            for edge in graph[source]:
                ok = _within(edge.target, tuple(a for a in rule.allowed if a != "launcher"))
                # The packages above an allowed module come with it (import-free).
                ok = ok or any(a.startswith(edge.target + ".") for a in rule.allowed)
                if edge.target == "launcher" and "launcher" in rule.allowed:
                    extra = set(edge.names) - rule.allowed_names
                    ok = not rule.allowed_names or not extra
                if not ok:
                    problems.append(f"{edge.path}:{edge.line}: {source} imports "
                                    f"{_shown(edge)} ({edge.text})")
        for chain in _reachable(graph, source, rule.forbidden):
            first = chain[0]
            route = " -> ".join([source] + [e.target for e in chain])
            problems.append(f"{first.path}:{first.line}: {first.text}\n"
                            f"      chain: {route}")
    return sorted(set(problems))


def _shown(edge: Edge) -> str:
    return f"{edge.target}.{'/'.join(edge.names)}" if edge.names else edge.target


def _reachable(graph: dict[str, list[Edge]], source: str,
               forbidden: tuple[str, ...]) -> list[list[Edge]]:
    """The shortest import chain from `source` to each forbidden module it reaches."""
    if not forbidden:
        return []
    found, seen = [], {source}
    queue: deque[tuple[str, list[Edge]]] = deque([(source, [])])
    while queue:
        module, chain = queue.popleft()
        for edge in graph.get(module, []):
            if edge.target in seen:
                continue
            seen.add(edge.target)
            route = chain + [edge]
            if _within(edge.target, forbidden):
                found.append(route)  # the chain stops at the first forbidden module
                continue
            queue.append((edge.target, route))
    return found


def report(rule: Rule, problems: list[str]) -> str:
    listing = "\n".join(f"  {p}" for p in problems)
    return (f"import rule broken: \"{rule.name}\"\n{listing}\n"
            f"why the rule: {rule.reason}\n(see {DESIGN})")


@pytest.mark.parametrize("rule", RULES, ids=[r.name.replace(" ", "-") for r in RULES])
def test_import_rule(rule):
    problems = violations(rule)
    if problems:
        pytest.fail(report(rule, problems), pytrace=False)


def test_every_rule_applies_to_an_existing_module():
    modules = launcher_modules(REPO)
    for rule in RULES:
        if rule.optional and not any(_applies(rule, m) for m in modules):
            continue
        assert any(_applies(rule, m) for m in modules), f"{rule.name}: no module matches"
        for target in rule.forbidden:
            assert any(_within(m, (target,)) for m in modules), f"{rule.name}: {target}?"


def test_only_the_supervisor_imports_its_generation_runner():
    """The runner is the supervisor's half (one generation's run): a module kept
    from the supervisor by a rule above must not reach around it through the runner."""
    importers = {source for source, edges in import_graph(REPO).items()
                 for edge in edges if edge.target == "launcher.job.run.runner"}
    assert importers == {"launcher.job.run.supervisor"}, importers


def test_design_page_names_every_rule():
    text = (REPO / "docs" / "design.md").read_text()
    missing = [rule.name for rule in RULES if rule.name not in text]
    assert not missing, f"docs/design.md does not describe these import rules: {missing}"


def _fake_repo(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_broken_rule_is_caught_with_its_chain(tmp_path):
    # plan -> states -> transport: a transitive import breaks "plan is pure".
    root = _fake_repo(tmp_path, {
        "launcher/__init__.py": "",
        "launcher/spec/plan.py": "from ..job.states import Row\n",
        "launcher/job/states.py": "import json\nfrom launcher.transport.link import AgentLink\n",
        "launcher/transport/__init__.py": "",
        "launcher/transport/link.py": "def helper():\n    from ..job.run.supervisor import x\n",
        "launcher/job/run/supervisor.py": "",
    })
    rule = next(r for r in RULES if r.name == "plan is pure")
    problems = violations(rule, root)
    assert problems and "chain: launcher.spec.plan -> launcher.job.states -> launcher.transport" \
        in problems[0], problems
    assert "launcher/spec/plan.py:1: from ..job.states import Row" in problems[0]
    message = report(rule, problems)
    assert message.startswith('import rule broken: "plan is pure"') and "pure function" in message
    # A lazy import inside a function counts too.
    rule = next(r for r in RULES if r.name == "transport is below the supervisor")
    assert any("launcher/transport/link.py:2" in p for p in violations(rule, root))


def test_allowed_only_rules_name_the_import(tmp_path):
    # A fake tree: module names need not be the real ones.
    root = _fake_repo(tmp_path, {
        "launcher/__init__.py": "__version__ = '0'\n",
        "launcher/agent.py": "from launcher import __version__\nfrom launcher.config import X\n",
        "launcher/config.py": "",
        "launcher/runtime/__init__.py": "from . import data\nfrom .. import plan\n",
        "launcher/runtime/data.py": "",
        "launcher/plan.py": "",
    })
    agent = next(r for r in RULES if r.name == "agent is standalone")
    assert violations(agent, root) == [
        "launcher/agent.py:2: launcher.agent imports launcher.config.X "
        "(from launcher.config import X)"]
    runtime = next(r for r in RULES if r.name == "runtime is shipped")
    assert violations(runtime, root) == [
        "launcher/runtime/__init__.py:2: launcher.runtime imports launcher.plan "
        "(from .. import plan)"]


@pytest.mark.parametrize("floor", FLOORS, ids=[f.name for f in FLOORS])
def test_no_import_runs_up_a_floor(floor):
    problems = floor_violations()[floor.name]
    if problems:
        order = " -> ".join(f.name for f in FLOORS)
        listing = "\n".join(f"  {p}" for p in problems)
        pytest.fail(f"import rule broken: \"{floor.name} imports no floor above it\"\n"
                    f"{listing}\nwhy the rule: the packages follow the data's flow "
                    f"({order}); the {floor.name} floor holds {floor.holds}, and nothing on "
                    f"it may depend on what comes later in the flow\n(see {FLOORS_DESIGN})",
                    pytrace=False)


def test_every_module_is_on_a_floor():
    lost = [m for m in launcher_modules(REPO) if floor_of(m) is None]
    assert not lost, f"add these modules to a floor of FLOORS: {lost}"


def test_an_import_up_a_floor_is_caught(tmp_path):
    root = _fake_repo(tmp_path, {
        "launcher/__init__.py": "",
        "launcher/job/__init__.py": "",
        "launcher/job/supervisor.py": "def f():\n    from ..views.printer import Printer\n",
        "launcher/views/__init__.py": "",
        "launcher/views/printer.py": "from ..job.supervisor import f\n",
    })
    problems = floor_violations(root)
    assert problems["job"] == [
        "launcher/job/supervisor.py:2: launcher.job.supervisor (job) imports launcher.views "
        "(views, a floor above) (from ..views.printer import Printer)",
        "launcher/job/supervisor.py:2: launcher.job.supervisor (job) imports "
        "launcher.views.printer (views, a floor above) (from ..views.printer import Printer)"]
    assert problems["views"] == []  # downward is fine


# job/'s rooms in the data's flow (launcher/job/__init__.py; docs/design.md, "The
# rooms of job/"): a room may import its own modules and the rooms before it.
ROOMS = ("record", "detect", "policy", "lines", "run")


def room_of(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) >= 3 and parts[:2] == ["launcher", "job"] and parts[2] in ROOMS:
        return ROOMS.index(parts[2])
    return None


def room_violations(root: Path = REPO) -> list[str]:
    """One message per import of a job module that runs to a later room."""
    found = []
    for source, edges in import_graph(root).items():
        here = room_of(source)
        for edge in edges:
            there = room_of(edge.target)
            if here is not None and there is not None and there > here:
                found.append(f"{edge.path}:{edge.line}: {source} ({ROOMS[here]}) imports "
                             f"{edge.target} ({ROOMS[there]}, a later room) ({edge.text})")
    return sorted(set(found))


def test_no_job_room_imports_a_later_one():
    problems = room_violations()
    assert not problems, ("job/'s rooms follow the flow (" + " -> ".join(ROOMS) + "); "
                          "move the shared value down or the caller up:\n" + "\n".join(problems))


def test_every_job_module_lives_in_a_room_that_says_what_it_holds():
    job = REPO / "launcher" / "job"
    loose = sorted(p.name for p in job.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"put these in a room of launcher/job/ ({', '.join(ROOMS)}): {loose}"
    rooms = {p.name for p in job.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == set(ROOMS), rooms
    for room in ROOMS:
        said = ast.get_docstring(ast.parse((job / room / "__init__.py").read_text())) or ""
        assert "import" in said.lower(), f"job/{room}/__init__.py: say what it holds and imports"
        assert f"`{room}`" in (ast.get_docstring(ast.parse((job / "__init__.py").read_text()))
                               or ""), f"launcher/job/__init__.py does not name the room {room}"


def test_an_import_to_a_later_room_is_caught(tmp_path):
    root = _fake_repo(tmp_path, {
        "launcher/__init__.py": "",
        "launcher/job/__init__.py": "",
        "launcher/job/record/__init__.py": "",
        "launcher/job/record/story.py": "from ..run.supervisor import Supervisor\n",
        "launcher/job/run/__init__.py": "",
        "launcher/job/run/supervisor.py": "from ..record.story import Story\n",
    })
    assert room_violations(root) == [
        "launcher/job/record/story.py:1: launcher.job.record.story (record) imports "
        f"{target} (run, a later room) (from ..run.supervisor import Supervisor)"
        for target in ("launcher.job.run", "launcher.job.run.supervisor")]


def test_the_wiring_rule_names_every_part_of_the_agent():
    parts = {p.stem for p in (REPO / "launcher" / "agent").glob("*.py")}
    assert parts - {"__init__", "__main__", "main"} == set(AGENT_PARTS)


# ------------------------------------------------------------ cycles and privates

KNOWN_CYCLES: tuple[frozenset[str], ...] = ()  # none: keep it so


def import_cycles(root: Path = REPO) -> list[list[str]]:
    """Each set of launcher modules that import each other, directly or not
    (lazy imports count): the strongly connected components of the import
    graph with more than one module. A module's import of its own packages
    is no edge: Python has run their `__init__` before the module."""
    graph = import_graph(root)
    edges = {src: sorted({e.target for e in found if e.target in graph and e.target != src
                          and not src.startswith(e.target + ".")})
             for src, found in graph.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in order:
            visit(node)
    return sorted(cycles)


def cycle_report(cycle: list[str], root: Path = REPO) -> str:
    graph = import_graph(root)
    lines = sorted({f"  {e.path}:{e.line}: {e.text}" for src in cycle for e in graph[src]
                    if e.target in cycle and e.target != src
                    and not src.startswith(e.target + ".")})
    return " <-> ".join(cycle) + "\n" + "\n".join(lines)


def test_no_import_cycle():
    cycles = [c for c in import_cycles() if frozenset(c) not in KNOWN_CYCLES]
    if cycles:
        pytest.fail("import cycles among launcher modules (a lazy import hides one, it does "
                    "not end it: move what both need to one of them, or below both):\n"
                    + "\n".join(cycle_report(c) for c in cycles), pytrace=False)
    left = {frozenset(c) for c in import_cycles()}
    assert all(known in left for known in KNOWN_CYCLES), "a known cycle is gone: drop it"


def private_uses(root: Path = REPO) -> list[str]:
    """`from launcher.x import _name` and `x._name` (x a launcher module imported
    by name) in another module: a private name is its module's own business."""
    modules = launcher_modules(root)
    found = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        rel = str(path.relative_to(root))
        module_aliases = {}  # local name -> launcher module
        for edge in import_edges(root, modules, name):
            node = _node_at(tree, edge.line)
            for alias in getattr(node, "names", ()):
                if (_private(alias.name) and edge.names and edge.target != name
                        and f"{edge.target}.{alias.name}" not in modules):
                    found.append(f"{rel}:{edge.line}: {edge.text}")
                local = alias.asname or alias.name.split(".")[0]
                full = f"{edge.target}.{alias.name}" if edge.names else alias.name
                if full in modules and (alias.asname or "." not in alias.name):
                    module_aliases[local] = full
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr)
                    and isinstance(node.value, ast.Name)
                    and module_aliases.get(node.value.id, name) != name):
                found.append(f"{rel}:{node.lineno}: {node.value.id}.{node.attr}")
    return sorted(set(found))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _node_at(tree: ast.Module, line: int) -> ast.AST | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and node.lineno == line:
            return node
    return None


def test_no_module_uses_another_modules_private_names():
    found = private_uses()
    assert not found, ("a module uses another module's private names (make the name "
                       "public where it is meant to be shared, or move it):\n"
                       + "\n".join(f"  {f}" for f in found))


def test_cycles_and_private_uses_are_caught(tmp_path):
    root = _fake_repo(tmp_path, {
        "launcher/__init__.py": "",
        "launcher/views/__init__.py": "",
        "launcher/views/a.py": "from .b import shown\n\n\ndef f():\n    from . import b\n"
                               "    return b._hidden\n",
        "launcher/views/b.py": "def g():\n    from .a import _helper\n",
    })
    assert import_cycles(root) == [["launcher.views.a", "launcher.views.b"]]
    assert private_uses(root) == ["launcher/views/a.py:6: b._hidden",
                                  "launcher/views/b.py:2: from .a import _helper"]


def test_no_command_keeps_exit_codes_of_its_own():
    """Every command's exit codes are one table, launcher/commands/exits.py."""
    found = []
    for name, path in launcher_modules(REPO).items():
        if floor_of(name) is None or FLOORS[floor_of(name)].name not in (
                "views", "tools", "commands", "cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            found += [f"{name}: {n}" for n in names if n.startswith("EXIT_")]
    assert not found, f"exit codes defined outside launcher/commands/exits.py: {found}"


def test_only_commands_install_signal_handlers():
    """A launch is handed its stops (job/sequence.py's StopRequest): the
    process's signal handlers are its command's (the cli, commands/), or, on
    the hosts, the agent's and the training process's own."""
    found = []
    for name, path in launcher_modules(REPO).items():
        if name.startswith(("launcher.commands", "launcher.cli", "launcher.agent",
                            "launcher.runtime")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "signal" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "signal"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, f"signal handlers installed outside the commands: {found}"
