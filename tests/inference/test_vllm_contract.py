"""Contract tests: the vllm engine against vLLM's own source, at both ends of the supported range.

vLLM's wheel is CUDA-only (it pins a CUDA torch, and its modules import torch and CUDA kernels), so it
cannot be imported on CPU CI. ``make test-vllm-contract`` installs the package alone (``pip install
--no-deps``) of the oldest and of the newest supported release (``auto.VLLM_MIN_VERSION``,
``auto.VLLM_MAX_VERSION``), each into its own venv, and runs these tests once against each
(``TELESCOPE_VLLM_VENV``). They **read its source with ``ast``** instead of importing it; vLLM moves
code between modules from release to release, so they find classes, functions and routes by name
where a release moved them (the layouts of 0.16-0.17 and of 0.33 both occur), and check what is in
them: our launch argv against ``EngineArgs`` / ``FrontendArgs`` (the dataclasses vLLM's argument parser
is generated from), our request bodies against its ``CompletionRequest`` model, the routes and
parameters we call, the attributes and modules our worker extension uses, the OpenTelemetry modules its
tracing imports, that ``cache_salt`` is part of its prefix-cache block hash, and what the run's guard
(``vllm_engine.guard``) relies on: ``--middleware`` added outermost, the engine client's calls, vLLM's
own control routes only in dev mode, ``VLLM_API_KEY`` and the OTLP exporter's environment headers.

Without ``TELESCOPE_VLLM_VENV`` (``make test``) every test skips, saying how to run them.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import warnings
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from telescope.core.inference import auto
from telescope.core.inference.protocol import CompletionChoice, CompletionRequest
from telescope.core.inference.settings import VllmEngineKwargs
from telescope.core.inference.vllm_engine import cpu_gemm as cpu_gemm_module
from telescope.core.inference.vllm_engine import guard as guard_module
from telescope.core.inference.vllm_engine import staged_reload as staged_reload_module
from telescope.core.inference.vllm_engine import worker as worker_module
from telescope.core.inference.vllm_engine.args import build_vllm_args, build_vllm_env
from telescope.core.inference.vllm_engine.guard import LORA_LOAD_PATH, RPC_PATH

from .conftest import make_cfg

ROOT = Path(__file__).resolve().parents[2]


def _vllm_package() -> Path | None:
    venv = os.environ.get("TELESCOPE_VLLM_VENV")
    found = sorted((ROOT / venv).glob("lib/python*/site-packages/vllm/__init__.py")) if venv else []
    return found[0].parent if found else None


VLLM = _vllm_package()
pytestmark = pytest.mark.skipif(
    VLLM is None,
    reason="no vLLM source to read (TELESCOPE_VLLM_VENV unset, or no vllm package in it): run `make "
    "test-vllm-contract` (installs the oldest and the newest supported release without their dependencies "
    "and runs these tests against each)",
)


@functools.cache
def _tree(rel: str) -> ast.Module:
    assert VLLM is not None
    with warnings.catch_warnings():  # vLLM's own invalid escapes in docstrings
        warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
        return ast.parse((VLLM / rel).read_text())


def _defined_names(path: Path) -> set[str]:
    """Names a vLLM module defines or imports at top level, following its ``from .x import *``."""
    assert VLLM is not None
    tree = _tree(str(path.relative_to(VLLM)))
    names: set[str] = set()
    for n in tree.body:
        if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
            names.add(n.name)
        elif isinstance(n, ast.Assign):
            names.update(ast.unparse(t) for t in n.targets)
        elif isinstance(n, ast.Import):
            names.update(a.asname or a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            if [a.name for a in n.names] == ["*"] and n.level == 1 and n.module:
                package = path.parent
                target = package / f"{n.module}.py"
                names |= _defined_names(target if target.is_file() else package / n.module / "__init__.py")
            else:
                names.update(a.asname or a.name for a in n.names)
    return names


def _module_file(module: str) -> Path:
    """vllm.a.b -> its file (a module or a package's __init__)."""
    assert VLLM is not None
    rel = Path(*module.split(".")[1:]) if "." in module else Path("__init__")
    for candidate in (VLLM / rel.with_suffix(".py"), VLLM / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise AssertionError(f"{module} does not exist in vLLM's source")


@functools.cache
def _top_level_definitions() -> dict[str, tuple[str, ...]]:
    """Every top-level class and function name of vLLM's source -> the files (relative) defining it."""
    assert VLLM is not None
    pattern = re.compile(r"^(?:async def|def|class) (\w+)", re.M)
    found: dict[str, list[str]] = {}
    for path in sorted(VLLM.rglob("*.py")):
        for name in pattern.findall(path.read_text(errors="replace")):
            found.setdefault(name, []).append(str(path.relative_to(VLLM)))
    return {name: tuple(files) for name, files in found.items()}


def _defined_in(name: str, under: str = "") -> list[str]:
    """The files under vllm/``under`` that define top-level ``name`` (where this release keeps it)."""
    return [f for f in _top_level_definitions().get(name, ()) if f.startswith(under)]


def _function(
    name: str, under: str = "entrypoints", containing: str = ""
) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The one top-level function ``name`` under vllm/``under`` whose source has ``containing``."""
    found = [
        node
        for rel in _defined_in(name, under)
        for node in _tree(rel).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name == name
        and containing in ast.unparse(node)
    ]
    assert len(found) == 1, f"{len(found)} functions {name} containing {containing!r} under vllm/{under}"
    return found[0]


def _class_file(name: str, under: str = "") -> str:
    """The one file under vllm/``under`` that defines class ``name``."""
    found = [
        rel
        for rel in _defined_in(name, under)
        if any(isinstance(n, ast.ClassDef) and n.name == name for n in _tree(rel).body)
    ]
    assert len(found) == 1, f"class {name}: defined in {found or 'no file'} under vllm/{under}"
    return found[0]


def _method_file(method: str, under: str) -> tuple[str, str]:
    """``(file, class)`` of the one class under vllm/``under`` that defines ``method``."""
    assert VLLM is not None
    found = [
        (str(path.relative_to(VLLM)), cls.name)
        for path in sorted((VLLM / under).rglob("*.py"))
        if f"def {method}(" in path.read_text(errors="replace")
        for cls in _tree(str(path.relative_to(VLLM))).body
        if isinstance(cls, ast.ClassDef)
        and any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == method for n in cls.body)
    ]
    assert len(found) == 1, f"{method}: defined by {found or 'no class'} under vllm/{under}"
    return found[0]


def _class(rel: str, name: str) -> ast.ClassDef:
    for node in _tree(rel).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"no class {name} in vllm/{rel}")


def _fields(rel: str, name: str) -> dict[str, str]:
    """Annotated fields of class ``name`` and of its bases found in the same file or imported into it
    from vllm (``field name -> annotation source``)."""
    cls = _class(rel, name)
    fields: dict[str, str] = {}
    for base in cls.bases:
        base_name = ast.unparse(base)
        where = _defining_file(rel, base_name)
        if where is not None:
            fields.update(_fields(where, base_name))
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            fields[node.target.id] = ast.unparse(node.annotation)
    return fields


def _defining_file(rel: str, name: str) -> str | None:
    """Where class ``name`` used in vllm/``rel`` is defined (the same file or a ``from vllm... import``)."""
    assert VLLM is not None
    tree = _tree(rel)
    if any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body):
        return rel
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm."):
            if any(alias.name == name for alias in node.names):
                return str(_module_file(node.module).relative_to(VLLM))
    return None


def _literal(name: str) -> list[str]:
    """The values of ``name = Literal[...]`` wherever vLLM's config or engine modules define it."""
    assert VLLM is not None
    for path in sorted([*(VLLM / "config").glob("*.py"), VLLM / "v1" / "engine" / "__init__.py"]):
        for node in _tree(str(path.relative_to(VLLM))).body:
            if isinstance(node, ast.Assign) and any(ast.unparse(t) == name for t in node.targets):
                value = node.value
                if isinstance(value, ast.Subscript) and ast.unparse(value.value) == "Literal":
                    elts = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
                    return [ast.literal_eval(e) for e in elts]
    raise AssertionError(f"no Literal {name} in vLLM's config")


@functools.cache
def _route_files() -> dict[str, tuple[str, ast.AsyncFunctionDef]]:
    """HTTP path -> (file, handler), from every ``@router.<method>("/path")`` in vLLM's entrypoints."""
    assert VLLM is not None
    routes: dict[str, tuple[str, ast.AsyncFunctionDef]] = {}
    for path in sorted((VLLM / "entrypoints").rglob("*.py")):
        rel = str(path.relative_to(VLLM))
        for node in ast.walk(_tree(rel)):
            if not isinstance(node, ast.AsyncFunctionDef):
                continue
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and ast.unparse(deco.func).startswith("router.") and deco.args:
                    route = deco.args[0]
                    if isinstance(route, ast.Constant) and isinstance(route.value, str):
                        routes.setdefault(route.value, (rel, node))
    return routes


def _routes() -> dict[str, ast.AsyncFunctionDef]:
    """HTTP path -> handler (``_route_files``)."""
    return {path: handler for path, (_, handler) in _route_files().items()}


# -- the installed release -------------------------------------------------------------------------


def test_the_release_read_is_the_one_asked_for_and_in_the_supported_range() -> None:
    assert VLLM is not None
    dist_info = sorted(VLLM.parent.glob("vllm-*.dist-info"))
    version = dist_info[0].name.removeprefix("vllm-").removesuffix(".dist-info")
    asked = os.environ.get("TELESCOPE_VLLM_CONTRACT_VERSION")
    assert asked is None or version == asked
    assert auto.vllm_version_problem(version) is None


# -- launch arguments -------------------------------------------------------------------------------


def _cli_fields() -> dict[str, str]:
    """``vllm serve`` options: EngineArgs (+ AsyncEngineArgs) and the OpenAI frontend's dataclasses."""
    fields = _fields("engine/arg_utils.py", "AsyncEngineArgs")
    fields.update(_fields(_class_file("FrontendArgs", "entrypoints"), "FrontendArgs"))
    return fields


def test_every_launch_flag_is_a_vllm_serve_option_with_a_value_it_accepts() -> None:
    cfg = make_cfg(enable_vllm_tracing=True, inference_access_log=False, vllm_scheduling_policy="priority")
    kwargs = VllmEngineKwargs(max_num_seqs=8, max_num_batched_tokens=4096)
    argv = build_vllm_args(
        cfg,
        kwargs,
        model_path="/m",
        index=0,
        host="127.0.0.1",
        port=8000,
        otlp_endpoint="http://127.0.0.1:4317/v1/traces",
    )
    off = build_vllm_args(
        cfg,
        VllmEngineKwargs(enable_prefix_caching=False),
        model_path="/m",
        index=0,
        host="127.0.0.1",
        port=8000,
    )
    fields = _cli_fields()
    flags = {f"--{name.replace('_', '-')}": (name, ann) for name, ann in fields.items()}
    flags.update(
        {f"--no-{name.replace('_', '-')}": (name, ann) for name, ann in fields.items() if "bool" in ann}
    )
    assert not argv[0].startswith("--")  # the model: `vllm serve [model_tag]`
    checked = set()
    for args in (argv, off):
        for i, flag in enumerate(args):
            if not flag.startswith("--"):
                continue
            assert flag in flags, f"{flag} is not an option of vllm serve"
            name, ann = flags[flag]
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            if "bool" in ann:
                assert value is None, f"{flag} is a switch; it takes no value"
            elif ann.split(" | ")[0][:1].isupper():  # a Literal alias: its values are the choices
                assert value in _literal(ann.split(" | ")[0]), f"{flag} {value}: not one of vLLM's choices"
            checked.add(name)
    assert {
        "logprobs_mode",
        "scheduling_policy",
        "dtype",
        "enable_prefix_caching",
        "worker_extension_cls",
        "otlp_traces_endpoint",
        "disable_uvicorn_access_log",
        "generation_config",
        "middleware",
    } <= checked


# -- request and response bodies --------------------------------------------------------------------


def test_every_completion_field_we_send_is_a_field_of_vllms_request_model() -> None:
    """vLLM's request models allow extra fields (logged, then ignored): a misspelt field would be
    silently dropped, so every field of ours must be one of its."""
    theirs = _fields("entrypoints/openai/completion/protocol.py", "CompletionRequest")
    ours = set(CompletionRequest.model_fields)
    assert ours - set(theirs) == set(), "fields vLLM would ignore"
    for name in ("prompt", "logprobs", "seed", "cache_salt", "request_id", "priority", "return_token_ids"):
        assert name in theirs
    choice = _fields("entrypoints/openai/completion/protocol.py", "CompletionResponseChoice")
    assert {"index", "text", "token_ids", "prompt_token_ids", "logprobs", "finish_reason"} <= set(choice)
    assert set(CompletionChoice.model_fields) - {"weight_versions"} <= set(choice)


def test_cache_salt_is_part_of_vllms_prefix_cache_block_hash() -> None:
    source = (VLLM / "v1" / "core" / "kv_cache_utils.py").read_text()  # type: ignore[operator]
    tree = ast.parse(source)
    salted = [
        f.name
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef)
        and "request.cache_salt" in ast.unparse(f)
        and "extra_keys" in ast.unparse(f)
    ]
    assert salted, "vLLM no longer hashes cache_salt into its blocks: prefix caching could serve stale KV"


# -- routes -----------------------------------------------------------------------------------------


def _query_params(handler: ast.AsyncFunctionDef) -> dict[str, str]:
    return {a.arg: ast.unparse(a.annotation) if a.annotation else "" for a in handler.args.args}


def _method(rel: str, cls: str, name: str) -> ast.AsyncFunctionDef | ast.FunctionDef:
    for node in _class(rel, cls).body:
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{cls}.{name} is not in vllm/{rel}")


def test_the_engine_client_has_the_calls_the_guard_makes() -> None:
    """``vllm_engine.guard`` serves /pause, /resume, /is_paused and the worker-extension RPC through
    ``app.state.engine_client`` (vLLM's ``EngineClient``), with these keywords."""
    rel = "engine/protocol.py"
    pause = _method(rel, "EngineClient", "pause_generation")
    assert {"mode", "clear_cache"} <= {a.arg for a in pause.args.kwonlyargs}
    assert "PauseMode" in ast.unparse(pause) and set(_literal("PauseMode")) == {"abort", "wait", "keep"}
    assert _method(rel, "EngineClient", "resume_generation").args.args[1:] == []
    assert _method(rel, "EngineClient", "is_paused").args.args[1:] == []
    rpc = _method(rel, "EngineClient", "collective_rpc")
    assert [a.arg for a in rpc.args.args] == ["self", "method", "timeout", "args", "kwargs"]
    _function("init_app_state", containing="state.engine_client = engine_client")


def _middleware_setup() -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The function that adds vLLM's middleware and then the ``--middleware`` classes: ``build_app``
    (0.16-0.17), or the function ``build_app`` calls for it (``init_entrypoints_middleware``, 0.33)."""
    found = [
        node
        for rel in _defined_in("build_app", "entrypoints") + _defined_in("init_entrypoints_middleware")
        for node in _tree(rel).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and "for middleware in args.middleware" in ast.unparse(node)
    ]
    assert len(found) == 1, "no single function of vLLM's adds the --middleware classes"
    build_app = _function("build_app", containing="FastAPI(")
    assert found[0] is build_app or f"{found[0].name}(args, app" in ast.unparse(build_app)
    return found[0]


def test_our_middleware_is_added_last_so_it_sees_every_request_first() -> None:
    """Starlette's ``add_middleware`` puts each new middleware outside the ones before: vLLM adds the
    ``--middleware`` classes after CORS and its own API-key check, so the guard runs before both (and
    before routing: routes that exist in vLLM never see a refused request)."""
    source = ast.unparse(_middleware_setup())
    ours = source.index("for middleware in args.middleware")
    assert source.index("AuthenticationMiddleware") < ours and source.index("CORSMiddleware") < ours
    loop = source[ours:]
    assert "app.add_middleware(imported)" in loop and "inspect.isclass(imported)" in loop
    assert loop.count("add_middleware(") == 1, "vLLM adds a middleware after ours"
    assert "middleware" in _cli_fields() and "list[str]" in _cli_fields()["middleware"]


def test_vllms_api_key_covers_only_api_prefixes_and_is_read_from_the_environment() -> None:
    """Why the guard is needed besides ``VLLM_API_KEY``: vLLM checks the key only on paths under its API
    prefixes (``/v1``; 0.33 also ``/v2``, ``/inference``, ``/cohere``), never on the control routes."""
    assert "envs.VLLM_API_KEY" in ast.unparse(_middleware_setup())
    where = _class_file("AuthenticationMiddleware", "entrypoints")
    call = _method(where, "AuthenticationMiddleware", "__call__")
    checks = [
        n.args[0]
        for n in ast.walk(call)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "url_path.startswith" and len(n.args) == 1
    ]
    assert len(checks) == 1, "vLLM's API-key check is no longer a path-prefix check"
    constants = {
        ast.unparse(t): node.value
        for node in _tree(where).body
        if isinstance(node, ast.Assign)
        for t in node.targets
    }
    prefix = ast.literal_eval(constants.get(ast.unparse(checks[0]), checks[0]))
    prefixes = (prefix,) if isinstance(prefix, str) else tuple(prefix)
    assert "/v1" in prefixes
    for path in ("/pause", "/resume", "/is_paused", "/collective_rpc", "/sleep", RPC_PATH, LORA_LOAD_PATH):
        assert not path.startswith(prefixes), f"vLLM's API key now covers {path}"
    envs = (VLLM / "envs.py").read_text()  # type: ignore[operator]
    assert 'os.environ.get("VLLM_API_KEY"' in envs


def _module_of(rel: str) -> str:
    return "vllm." + rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _imported_modules(rel: str, node: ast.AST) -> set[str]:
    """The vllm modules ``node`` (in vllm/``rel``) imports from, relative imports resolved."""
    package = _module_of(rel).split(".")[: -1 if not rel.endswith("__init__.py") else None]
    found = set()
    for imp in ast.walk(node):
        if isinstance(imp, ast.ImportFrom):
            base = package[: len(package) - imp.level + 1] if imp.level else []
            found.add(".".join([*base, *([imp.module] if imp.module else [])]))
    return found


@functools.cache
def _entrypoint_functions() -> tuple[tuple[str, set[str]], ...]:
    """Every top-level function of vLLM's entrypoints: its name and the vllm modules it imports."""
    assert VLLM is not None
    return tuple(
        (fn.name, _imported_modules(rel, fn))
        for rel in (str(p.relative_to(VLLM)) for p in sorted((VLLM / "entrypoints").rglob("*.py")))
        for fn in _tree(rel).body
        if isinstance(fn, ast.FunctionDef)
    )


@functools.cache
def _entrypoint_calls() -> tuple[Counter[str], Counter[str]]:
    """Calls in vLLM's entrypoints by callee: all of them, and those inside ``if envs.VLLM_SERVER_DEV_MODE:``."""
    assert VLLM is not None
    calls: Counter[str] = Counter()
    gated: Counter[str] = Counter()
    for path in sorted((VLLM / "entrypoints").rglob("*.py")):
        for node in ast.walk(_tree(str(path.relative_to(VLLM)))):
            if isinstance(node, ast.Call):
                calls[ast.unparse(node.func)] += 1
            if isinstance(node, ast.If) and ast.unparse(node.test) == "envs.VLLM_SERVER_DEV_MODE":
                gated.update(
                    ast.unparse(c.func)
                    for stmt in node.body
                    for c in ast.walk(stmt)
                    if isinstance(c, ast.Call)
                )
    return calls, gated


def _only_in_dev_mode(route_file: str) -> bool:
    """Whether vLLM attaches the routes of ``route_file`` only with ``VLLM_SERVER_DEV_MODE``: its own
    ``attach_router`` checks (0.16-0.17), or every function importing it is called only inside
    ``if envs.VLLM_SERVER_DEV_MODE:`` (0.33 registers whole router packages that way)."""
    attach = [
        n for n in _tree(route_file).body if isinstance(n, ast.FunctionDef) and n.name == "attach_router"
    ]
    if attach and "if not envs.VLLM_SERVER_DEV_MODE" in ast.unparse(attach[0]):
        return True
    registrars = {name for name, modules in _entrypoint_functions() if _module_of(route_file) in modules}
    calls, gated = _entrypoint_calls()
    return bool(registrars) and all(0 < calls[name] == gated[name] for name in registrars)


def test_vllms_control_routes_exist_only_in_dev_mode_which_we_turn_off() -> None:
    assert VLLM is not None
    routes = _route_files()
    for path in ("/pause", "/resume", "/is_paused", "/collective_rpc", "/sleep", "/reset_prefix_cache"):
        assert path in routes, path
        where = routes[path][0]
        assert _only_in_dev_mode(where), f"{path} ({where}) is served without dev mode"
    assert build_vllm_env(make_cfg())["VLLM_SERVER_DEV_MODE"] == "0"
    envs = (VLLM / "envs.py").read_text()  # type: ignore[operator]
    assert 'bool(int(os.getenv("VLLM_SERVER_DEV_MODE", "0")))' in envs  # "0" means off


def test_vllms_otlp_exporter_takes_its_headers_from_the_environment() -> None:
    """The run's secret reaches the driver's OTLP receiver as ``OTEL_EXPORTER_OTLP_TRACES_HEADERS``,
    which the exporter reads only when vLLM passes no ``headers`` of its own."""
    exporters = [
        n
        for n in ast.walk(_tree("tracing/otel.py"))
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "OTLPHttpExporter"
    ]
    assert exporters and all("headers" not in {k.arg for k in n.keywords} for n in exporters)


def test_abort_relies_on_disconnect_which_vllm_honours() -> None:
    """``/abort_requests`` exists only with ``--tokens-only``; a completion is aborted when its client
    disconnects (``with_cancellation``), which is what ``VllmClient.abort`` does."""
    handler = _routes()["/v1/completions"]
    assert "with_cancellation" in [ast.unparse(d) for d in handler.decorator_list]
    attach = [
        ast.unparse(n)
        for rel in _defined_in("attach_router", "entrypoints")
        for n in _tree(rel).body
        if isinstance(n, ast.FunctionDef)
        and n.name == "attach_router"
        and "/abort_requests" in ast.unparse(_tree(rel))
    ]
    assert any("tokens_only" in a for a in attach)  # the legacy /abort_requests: only with --tokens-only
    client_source = Path(__import__("telescope.core.inference.vllm_engine.client", fromlist=["x"]).__file__)
    assert "/abort_requests" not in ast.unparse(ast.parse(client_source.read_text()).body[-1])


# -- worker extension -------------------------------------------------------------------------------


def _assigned_self_attributes(cls: ast.ClassDef) -> set[str]:
    return {
        t.attr
        for node in ast.walk(cls)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"
    }


def test_the_worker_extension_finds_what_it_uses_on_vllms_gpu_worker() -> None:
    worker = _class("v1/worker/gpu_worker.py", "Worker")
    base = _class("v1/worker/worker_base.py", "WorkerBase")
    attributes = _assigned_self_attributes(worker) | _assigned_self_attributes(base)
    extension = worker_module.TelescopeWeightSyncExtension
    assert set(extension.__annotations__) <= attributes  # model_runner, vllm_config, model_config, device
    theirs = {n.name for c in (worker, base) for n in c.body if isinstance(n, ast.FunctionDef)}
    ours = {n for n in vars(extension) if not n.startswith("__")}
    assert ours & theirs == set(), "an extension method would shadow vLLM's"
    assert "worker_extension_cls" in ast.unparse(_tree("v1/worker/worker_base.py"))


@pytest.mark.parametrize(
    "module", [worker_module, staged_reload_module, cpu_gemm_module], ids=lambda m: m.__name__
)
def test_every_vllm_name_the_worker_extension_imports_exists(module: Any) -> None:
    tree = ast.parse(Path(module.__file__).read_text())
    imports = [
        n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("vllm")
    ]
    assert imports, f"{module.__name__} imports nothing from vLLM?"
    for node in imports:
        assert node.module is not None
        defined = _defined_names(_module_file(node.module))
        for alias in node.names:
            submodule = VLLM / Path(*f"{node.module}.{alias.name}".split(".")[1:])  # type: ignore[operator]
            assert alias.name in defined or submodule.with_suffix(".py").is_file(), (
                f"from {node.module} import {alias.name}: not in vLLM"
            )


def test_the_layerwise_reload_takes_the_arguments_we_pass() -> None:
    tree = _tree("model_executor/model_loader/reload/layerwise.py")
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}

    def parameters(name: str) -> list[str]:
        """``name``'s parameters, through a ``def f(*args, **kwargs): g(*args, **kwargs)`` (0.33)."""
        function = functions[name]
        if function.args.vararg and not function.args.args:
            forwarded = [c for c in ast.walk(function) if isinstance(c, ast.Call)]
            assert len(forwarded) == 1 and isinstance(forwarded[0].args[0], ast.Starred)
            return parameters(ast.unparse(forwarded[0].func))
        return [a.arg for a in function.args.args]

    assert parameters("initialize_layerwise_reload") == ["model"]
    assert parameters("finalize_layerwise_reload") == ["model", "model_config"]


def test_the_staged_reload_finds_what_it_reads_in_vllm() -> None:
    """``staged_reload`` reads each layer's checkpoint form from the metadata vLLM records for its
    reload, binds loaders back with ``restore_layer_refs(tensor, layer)``, re-processes layers with
    their method's ``process_weights_after_loading(layer)``, and learns what was loaded from
    ``load_weights``' returned names (``AutoWeightsLoader``, which the models use)."""
    info = _fields("model_executor/model_loader/reload/types.py", "LayerReloadingInfo")
    assert "restore_metadata" in info and "LayerTensors" in info["restore_metadata"]
    refs = _function("restore_layer_refs", under="model_executor/model_loader/reload")
    assert [a.arg for a in refs.args.args] == ["tensor", "layer"]
    for rel, cls in (
        ("model_executor/layers/linear.py", "UnquantizedLinearMethod"),
        ("model_executor/layers/vocab_parallel_embedding.py", "UnquantizedEmbeddingMethod"),
    ):
        method = next(
            n
            for n in _class(rel, cls).body
            if isinstance(n, ast.FunctionDef) and n.name == "process_weights_after_loading"
        )
        assert [a.arg for a in method.args.args] == ["self", "layer"], (cls, ast.unparse(method.args))
    loader = _method("model_executor/models/utils.py", "AutoWeightsLoader", "load_weights")
    assert loader.returns is not None and "set[str]" in ast.unparse(loader.returns)
    qwen2 = _method("model_executor/models/qwen2.py", "Qwen2ForCausalLM", "load_weights")
    assert "return loader.load_weights" in ast.unparse(qwen2)


def test_the_cpu_gemm_plugin_switches_what_vllm_reads_when_it_packs_a_cpu_linear_layer() -> None:
    """``vllm_engine.cpu_gemm`` (a ``vllm.general_plugins`` entry point) sets
    ``_custom_ops._supports_onednn`` false: vLLM must call that group's plugins in its workers before
    building the model, define the flag, and test it in ``dispatch_cpu_unquantized_gemm`` (which
    unquantized linear layers call when processed on CPU), falling back to torch's linear."""
    assert '"vllm.general_plugins"' in (VLLM / "plugins/__init__.py").read_text()  # type: ignore[operator]
    assert "load_general_plugins()" in ast.unparse(_tree("v1/worker/worker_base.py"))
    assert "_supports_onednn" in _defined_names(VLLM / "_custom_ops.py")  # type: ignore[operator]
    dispatch = ast.unparse(_function("dispatch_cpu_unquantized_gemm", under="model_executor/layers"))
    assert "ops._supports_onednn" in dispatch and "torch.nn.functional.linear" in dispatch
    linear = ast.unparse(_class("model_executor/layers/linear.py", "UnquantizedLinearMethod"))
    assert "dispatch_cpu_unquantized_gemm(layer" in linear


# -- tracing ----------------------------------------------------------------------------------------


def test_we_check_every_opentelemetry_module_vllms_tracing_imports() -> None:
    tree = _tree("tracing/otel.py")
    imported = {
        n.module
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("opentelemetry.exporter")
    }
    assert imported and imported <= set(auto.TRACING_MODULES), imported - set(auto.TRACING_MODULES)


def test_seeded_requests_take_vllms_per_request_sampling_loop() -> None:
    """Why ``per_request_seed`` is off by default on vLLM: its sampler draws seeded requests one by one."""
    tree = _tree("v1/sample/ops/topk_topp_sampler.py")
    loops = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.For) and ast.unparse(n.iter).endswith("generators.items()")
    ]
    assert loops, "vLLM no longer samples seeded requests one by one: per_request_seed could default on"


def test_pause_keep_with_clear_cache_resets_the_caches() -> None:
    """Why the client sends ``clear_cache`` explicitly: vLLM's default (true) resets its caches also in
    ``keep`` mode: the engine client's ``pause_generation`` resets the prefix cache after pausing (0.16),
    or the engine core's ``pause_scheduler`` does (``_finish_pause`` -> ``_reset_caches`` ->
    ``reset_prefix_cache(reset_running_requests=True)``: running requests' KV too, 0.17 on)."""
    methods = {
        node.name: node
        for rel in ("v1/engine/async_llm.py", "v1/engine/core.py")
        for node in ast.walk(_tree(rel))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }

    def resets_when_clear_cache(name: str, depth: int = 3) -> bool:
        """Whether ``name`` (or a method it calls on self, ``clear_cache`` passed on) resets a cache
        under ``if clear_cache:``."""
        for node in ast.walk(methods[name]):
            if isinstance(node, ast.If) and ast.unparse(node.test) == "clear_cache":
                if "reset_prefix_cache(" in ast.unparse(node) or "self._reset_caches(" in ast.unparse(node):
                    return True
            if isinstance(node, ast.Call) and depth and "clear_cache" in [ast.unparse(a) for a in node.args]:
                callee = ast.unparse(node.func).removeprefix("self.")
                if callee in methods and resets_when_clear_cache(callee, depth - 1):
                    return True
        return False

    assert "clear_cache" in ast.unparse(methods["pause_generation"])
    assert resets_when_clear_cache("pause_generation") or resets_when_clear_cache("pause_scheduler")
    handler = _routes()["/pause"]
    names = [a.arg for a in handler.args.args][-len(handler.args.defaults) :]
    defaults = dict(zip(names, handler.args.defaults, strict=True))
    assert "True" in ast.unparse(defaults["clear_cache"])  # vLLM's default: the client must say false


# -- LoRA (issue #31) --------------------------------------------------------------------------------


def test_lora_launch_flags_are_vllm_serve_options_and_the_rank_one_of_its_choices() -> None:
    from telescope.core.inference.vllm_engine.args import VLLM_LORA_RANKS

    fields = _cli_fields()
    assert fields["enable_lora"].startswith("bool")
    assert fields["max_lora_rank"] in ("MaxLoRARanks", "int")  # 0.16: int, checked by LoRAConfig's
    assert _fields("config/lora.py", "LoRAConfig")["max_lora_rank"] == "MaxLoRARanks"
    assert tuple(_literal("MaxLoRARanks")) == VLLM_LORA_RANKS
    assert fields["max_loras"].startswith("int") and fields["max_cpu_loras"].startswith("int")
    for rank in (1, 4, 16, 100, 512):
        argv = build_vllm_args(
            make_cfg(lora_rank=rank), VllmEngineKwargs(), model_path="/m", index=0, host="h", port=1
        )
        at = argv.index("--max-lora-rank")
        assert int(argv[at + 1]) in _literal("MaxLoRARanks") and int(argv[at + 1]) >= rank
    # max_cpu_loras below max_loras is refused by vLLM; ours are equal (one adapter)
    assert "max_cpu_loras < self.max_loras" in ast.unparse(_class("config/lora.py", "LoRAConfig"))


def _parse_fine_tuned_lora_name() -> Any:
    """vLLM's own ``parse_fine_tuned_lora_name`` (pure Python), executed from its source."""
    node = next(
        n
        for n in _tree("lora/utils.py").body
        if isinstance(n, ast.FunctionDef) and n.name == "parse_fine_tuned_lora_name"
    )
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "vllm/lora/utils.py", "exec"), namespace)
    return namespace["parse_fine_tuned_lora_name"]


def test_our_adapter_names_map_to_the_modules_vllms_own_parser_gives() -> None:
    from telescope.core.inference.vllm_engine.lora import vllm_lora_module

    theirs = _parse_fine_tuned_lora_name()
    for name in (
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.layers.3.mlp.down_proj.lora_B.weight",
        "base_model.model.model.embed_tokens.lora_embedding_A",
        "model.layers.0.self_attn.o_proj.lora_B.weight",
    ):
        assert vllm_lora_module(name) == theirs(name, None), name
    with pytest.raises(ValueError, match="unsupported LoRA weight"):
        theirs("base_model.model.model.layers.0.self_attn.q_proj.weight", None)


def test_the_adapter_folder_we_write_is_what_vllms_loader_reads() -> None:
    from telescope.core.inference.vllm_engine import lora

    source = ast.unparse(_tree("lora/lora_model.py")) + ast.unparse(_tree("lora/peft_helper.py"))
    assert f"'{lora.ADAPTER_FILE}'" in source and f"'{lora.CONFIG_FILE}'" in source
    helper = _fields("lora/peft_helper.py", "PEFTHelper")
    required = {"r", "lora_alpha", "target_modules"}
    assert required <= set(helper)
    names = ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    config = lora.adapter_config({"lora_rank": 8, "lora_alpha": 16.0, "model": "m"}, names)
    assert required <= set(config)
    # bias "none", no DoRA, no modules_to_save: what PEFTHelper.validate_legal accepts
    assert config["bias"] == "none" and not config["use_dora"] and "modules_to_save" not in config
    # vLLM scales the adapter by lora_alpha / r of the folder, as peft does in the trainer (no rsLoRA)
    post_init = ast.unparse(_method("lora/peft_helper.py", "PEFTHelper", "__post_init__"))
    if "self.vllm_lora_scaling_factor = self._scaling(self.r, self.lora_alpha)" in post_init:  # 0.33
        scaling = _method("lora/peft_helper.py", "PEFTHelper", "_scaling")
        namespace: dict[str, Any] = {"math": __import__("math")}
        exec(
            compile(ast.Module(body=[scaling], type_ignores=[]), "vllm/lora/peft_helper.py", "exec"),
            namespace,
        )
        as_configured = SimpleNamespace(use_rslora=config["use_rslora"])
        assert namespace["_scaling"](as_configured, 8, 16.0) == 16.0 / 8
    else:
        assert "self.vllm_lora_scaling_factor = self.lora_alpha / self.r" in post_init
    assert not config["use_rslora"]


def test_the_guard_loads_adapters_through_vllms_serving_models_in_place() -> None:
    # app.state.openai_serving_models is set at start-up
    _function("init_app_state", containing="state.openai_serving_models = OpenAIServingModels(")
    # the request we pass carries every field of vLLM's LoadLoRAAdapterRequest, with its defaults ...
    ours = vars(guard_module._LoadLoRA(lora_name="a", lora_path="/p"))
    theirs = _fields("entrypoints/serve/lora/protocol.py", "LoadLoRAAdapterRequest")
    assert set(theirs) <= set(ours), f"fields of vLLM's request the guard's lacks: {set(theirs) - set(ours)}"
    request = _class("entrypoints/serve/lora/protocol.py", "LoadLoRAAdapterRequest")
    for field in request.body:
        if (
            isinstance(field, ast.AnnAssign)
            and field.value is not None
            and ast.unparse(field.target) != "load_inplace"
        ):
            assert ours[ast.unparse(field.target)] == ast.literal_eval(field.value), ast.unparse(field)
    assert ours["load_inplace"] is True  # reloaded in place, under the same name and id
    # ... and load_lora_adapter (and its check) reads no other
    read: set[str] = set()
    for name in ("load_lora_adapter", "_check_load_lora_adapter_request"):
        method = _method("entrypoints/openai/models/serving.py", "OpenAIServingModels", name)
        read |= {
            n.attr
            for n in ast.walk(method)
            if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "request"
        }
    assert read <= set(ours) and {"lora_name", "lora_path", "load_inplace"} <= read
    load = ast.unparse(
        _method("entrypoints/openai/models/serving.py", "OpenAIServingModels", "load_lora_adapter")
    )
    assert "self.lora_requests[lora_name].lora_int_id if lora_name in self.lora_requests" in load  # same id
    assert "load_inplace=request.load_inplace" in load
    assert "self.lora_requests[lora_name] = lora_request" in load  # the request kept is the one loaded
    assert "await self.engine_client.add_lora(lora_request)" in load
    # an ErrorResponse (not a str) on failure: the guard raises on anything but a str
    assert "ErrorResponse | str" in ast.unparse(
        _method("entrypoints/openai/models/serving.py", "OpenAIServingModels", "load_lora_adapter").returns  # type: ignore[arg-type]
    )


def test_load_inplace_reloads_from_disk_at_every_step_which_is_why_the_guard_clears_it() -> None:
    fields = _fields("lora/request.py", "LoRARequest")
    assert {"lora_name", "lora_int_id", "lora_path", "load_inplace"} <= set(fields)
    assert "msgspec.Struct" in ast.unparse(_class("lora/request.py", "LoRARequest").bases[0])
    assert "frozen" not in ast.unparse(_class("lora/request.py", "LoRARequest"))  # settable
    add = ast.unparse(_method("lora/worker_manager.py", "LRUCacheWorkerLoRAManager", "add_adapter"))
    assert "lora_request.lora_int_id not in self.list_adapters() or lora_request.load_inplace" in add
    assert "self._adapter_manager.remove_adapter(lora.id)" in add  # replaced in place, under its id
    # the engine client's add_lora reaches that method in every worker
    assert "return self.model_executor.add_lora(lora_request)" in ast.unparse(
        _method("v1/engine/core.py", "EngineCore", "add_lora")
    )
    assert "return self.model_runner.add_lora(lora_request)" in ast.unparse(
        _method("v1/worker/gpu_worker.py", "Worker", "add_lora")
    )
    mixin = "v1/worker/lora_model_runner_mixin.py"
    assert "return self.lora_manager.add_adapter(lora_request)" in ast.unparse(
        _method(mixin, "LoRAModelRunnerMixin", "add_lora")
    )
    assert "self.lora_manager = LRUCacheWorkerLoRAManager(" in ast.unparse(_tree(mixin))
    # the worker applies the running requests' adapters at every step
    assert "self.lora_manager.set_active_adapters(lora_requests" in ast.unparse(
        _tree("v1/worker/lora_model_runner_mixin.py")
    )


def test_a_completion_naming_the_adapter_as_its_model_is_served_with_it() -> None:
    get = ast.unparse(_method(*_method_file("_maybe_get_adapters", "entrypoints"), "_maybe_get_adapters"))
    assert "if request.model in self.models.lora_requests:" in get
    assert "return self.models.lora_requests[request.model]" in get
    assert "self._maybe_get_adapters(request)" in ast.unparse(
        _tree("entrypoints/openai/completion/serving.py")
    )
    assert "model" in _fields("entrypoints/openai/completion/protocol.py", "CompletionRequest")


def test_the_worker_extensions_lora_path_uses_vllms_tp_rank() -> None:
    assert "get_tensor_model_parallel_rank" in _defined_names(_module_file("vllm.distributed"))
