"""The lists of policies, option values, CLI options and defaults in README.md and docs/*.md, checked
against the code.

Conventions the docs keep (each test below fails when its list is no longer found, so a reworded passage
cannot silently stop being checked):

- Policies of the memories: README's table whose header has ``policies (default first)`` (one row per
  memory class, the policies as code spans, the default first; "`x` (no LLM) / `y` (LLM)" when the
  default depends on an LLM), and docs/llamaindex.md's sentence ``Policies (default first): SegTreeIndex
  `a | b`; ...`` (one code span of ``|``-separated names per index class).
- Values of an option: a code span ``name="a"|"b"`` or the run ``name="a"`, `"b"` or `"c"``: the complete
  set of values, compared with the code's tuple of choices (``OPTION_VALUES``). Every single
  ``name="value"`` code span of those options must name a valid value. A ``policy=...`` enumeration is
  compared with the policies of the memory whose name begins the title of its section.
- CLI: every ``hiermem <command> ...`` in a shell block (run or skipped) or an inline code span names a
  command of the typer app and only that command's options; ``--memory a|b|c`` in docs/mcp.md is the MCP
  server's memory kinds, and its "Tools" list the MCP server's tools.
- Defaults: the "Defaults (...)" sentence of SegTreeMem in docs/evaluation.md, the ``argument | default``
  table of ``HierMemBlock`` in docs/llamaindex.md and the middleware's "**Options.**" bullet in
  docs/langchain.md.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from tests.support.docs import BLOCKS, DOC_FILES, ROOT, SHELL

README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _prose(path: Path) -> str:
    """The page without its fenced blocks (so code is not mistaken for lists in the prose)."""
    out, fence = [], None
    for line in _text(path).splitlines():
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m and (fence is None or m.group(1).startswith(fence)):
            fence = m.group(1) if fence is None else None
            out.append("")
            continue
        out.append("" if fence else line)
    return "\n".join(out)


def _section_of(text: str, pos: int) -> str:
    """Title of the nearest heading above ``pos``."""
    heads = list(re.finditer(r"^#+\s+(.*)$", text[:pos], re.M))
    return heads[-1].group(1).strip() if heads else ""


def _memory_classes():
    from shared_core import HAT, MemTree, SegTreeMem, XMemory

    return {c.__name__: c for c in (SegTreeMem, MemTree, HAT, XMemory)}


def _default(cls, name: str):
    return inspect.signature(cls.__init__).parameters[name].default


# --------------------------------------------------------------------------- policies
def test_readme_policy_table_matches_every_memory() -> None:
    text = _text(README)
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("|") and "policies (default first)" in ln)
    rows = []
    for ln in lines[head + 2 :]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
    classes = _memory_classes()
    seen = set()
    for cells in rows:
        name = re.findall(r"`(\w+)`", cells[0])[0]
        cls = classes[name]
        seen.add(name)
        cell = cells[1]
        listed = re.findall(r"`(\w+)`", cell)
        assert sorted(listed) == sorted(cls.policies), (
            f"README lists {listed} for {name}, the code {cls.policies}"
        )
        assert listed[0] == cls.default_policy, f"{name}: default {cls.default_policy!r} is not listed first"
        if "(LLM)" in cell:
            with_llm = re.search(r"`(\w+)` \(LLM\)", cell).group(1)
            assert with_llm == _default(cls, "llm_policy"), f"{name}: default policy with an LLM"
            assert with_llm in cls.llm_policies
    assert seen == set(classes), f"the table misses {set(classes) - seen}"


def test_llamaindex_policies_match_every_index() -> None:
    import llamaindex_hiermem

    text = _prose(DOCS / "llamaindex.md").replace("\n", " ")
    m = re.search(r"Policies \(default first\):(.*?)\.(\s|$)", text, re.S)
    assert m, "docs/llamaindex.md: the sentence 'Policies (default first): ...' is gone"
    sentence = m.group(1)
    found = re.findall(r"(\w+Index) `([^`]+)`", sentence)
    assert {name for name, _ in found} == {"SegTreeIndex", "MemTreeIndex", "HATIndex", "XMemoryIndex"}
    for name, listed in found:
        cls = getattr(llamaindex_hiermem, name).memory_class()
        policies = [p.strip() for p in listed.split("|")]
        assert sorted(policies) == sorted(cls.policies), f"{name}: docs {policies}, code {cls.policies}"
        assert policies[0] == cls.default_policy, f"{name}: default {cls.default_policy!r} is not first"
    hat = _memory_classes()["HAT"]
    m = re.search(r"HATIndex `[^`]+` \(with an LLM the default is `(\w+)`\)", sentence)
    assert m and m.group(1) == _default(hat, "llm_policy")
    m = re.search(r"Policies that need an LLM \(HAT's ([^)]*)\)", text)
    assert m and set(re.findall(r"`(\w+)`", m.group(1))) == set(hat.llm_policies)


# --------------------------------------------------------------------------- option values
def _option_values() -> dict[str, tuple[str, ...]]:
    from shared_core.memories.base import ANNOTATION_VECTORS
    from shared_core.memories.segtree import COMPAT_MODELS, TOP_DOWN_WEIGHTS
    from shared_core.search.ranking import ADMISSIBLE, RELEVANCE_KINDS

    return {
        "compat": COMPAT_MODELS,
        "relevance": RELEVANCE_KINDS,
        "admissible": ADMISSIBLE,
        "annotation_vectors": ANNOTATION_VECTORS,
        "top_down_weights": TOP_DOWN_WEIGHTS,
    }


ENUM = re.compile(
    r'`(?P<name>\w+)="(?P<first>[\w-]+)"(?P<pipes>(?:\|"[\w-]+")+)`'  # `name="a"|"b"`
    # `name="a"`, `"b"` or `"c"`
    r'|`(?P<name2>\w+)="(?P<first2>[\w-]+)"`(?P<rest>(?:, `"[\w-]+"`)* or `"[\w-]+"`)'
)
SINGLE = re.compile(r'`(\w+)="([\w-]+)"`')


def _enumerations():
    for path in DOC_FILES:
        text = _prose(path)
        for m in ENUM.finditer(text.replace("\n", " ")):
            if m.group("name"):
                name, values = (
                    m.group("name"),
                    [m.group("first"), *re.findall(r'"([\w-]+)"', m.group("pipes"))],
                )
            else:
                name, values = (
                    m.group("name2"),
                    [m.group("first2"), *re.findall(r'"([\w-]+)"', m.group("rest"))],
                )
            line = text[: m.start()].count("\n") + 1
            yield path, line, name, values, _section_of(text, m.start())


def test_option_value_lists_are_complete() -> None:
    options = _option_values()
    classes = _memory_classes()
    checked = set()
    for path, line, name, values, section in _enumerations():
        where = f"{path.relative_to(ROOT)}:{line}"
        if name == "policy":
            memory = re.match(r"\w*", section).group(0)
            assert memory in classes, f"{where}: a policy list outside a memory's section ({section!r})"
            expected = classes[memory].policies
        else:
            assert name in options, f"{where}: values of {name!r} listed; add the option to _option_values"
            expected = options[name]
        assert sorted(values) == sorted(expected), f"{where}: {name} lists {values}, the code has {expected}"
        checked.add(name)
    assert checked >= {"compat", "relevance", "admissible", "policy"}, checked


def test_every_quoted_option_value_exists() -> None:
    options = _option_values()
    for path in DOC_FILES:
        text = _prose(path)
        for m in SINGLE.finditer(text):
            name, value = m.groups()
            if name in options:
                line = text[: m.start()].count("\n") + 1
                assert value in options[name], (
                    f"{path.relative_to(ROOT)}:{line}: {name}={value!r} is not one of {options[name]}"
                )


# --------------------------------------------------------------------------- CLI
def _cli():
    import typer.main

    from shared_core.cli import app

    return typer.main.get_command(app)


def _hiermem_commands():
    """(where, argv) of every `hiermem ...` command in the shell blocks and the inline code spans."""
    for b in BLOCKS:
        if b.lang not in SHELL:
            continue
        for k, line in enumerate(b.code.replace("\\\n", " ").splitlines()):
            cmd = line.split(" #")[0].strip()
            if cmd.startswith("hiermem "):
                yield f"{b.id} (+{k})", cmd.split()[1:]
    for path in DOC_FILES:
        text = _prose(path)
        for m in re.finditer(r"`(hiermem [^`]+)`", text.replace("\n", " ")):
            yield f"{path.relative_to(ROOT)} `{m.group(1)}`", m.group(1).split()[1:]


def test_cli_commands_in_the_docs_exist_with_their_options() -> None:
    group = _cli()
    n = 0
    for where, argv in _hiermem_commands():
        sub = argv[0]
        assert sub in group.commands, (
            f"{where}: no command `hiermem {sub}` (commands: {sorted(group.commands)})"
        )
        opts = {o for p in group.commands[sub].params for o in p.opts} | {"--help"}
        for tok in argv[1:]:
            if tok.startswith("-") and not re.fullmatch(r"-\d.*", tok):
                opt = tok.split("=")[0].strip("[]")
                assert opt in opts, f"{where}: `hiermem {sub}` has no option {opt} (options: {sorted(opts)})"
        n += 1
    assert n > 20, n


def test_mcp_memory_choices() -> None:
    from shared_core.serve.mcp_server import MEMORY_KINDS

    m = re.search(
        r"`--memory ([\w|]+)` chooses the memory of new namespaces \(default `(\w+)`\)",
        _prose(DOCS / "mcp.md"),
    )
    assert m, "docs/mcp.md: the --memory sentence is gone"
    assert m.group(1).split("|") == list(MEMORY_KINDS)
    option = next(p for p in _cli().commands["mcp"].params if "--memory" in p.opts)
    assert m.group(2) == option.default


def test_eval_baselines_table() -> None:
    from shared_core.eval import methods

    text = _prose(DOCS / "evaluation.md")
    table = text[text.index("| baseline | what it ranks by |") :].split("\n\n")[0]
    rows = re.findall(r"^\| `(\w+)`(?: \(alias `(\w+)`\))? \|", table, re.M)
    assert {name for name, _ in rows} == set(methods.BASELINES)
    for name, alias in rows:
        if alias:
            assert methods._ALIASES[alias] == name
    m = re.search(r"`baselines`\s*\(([^)]*)\)", text)
    assert m and tuple(re.findall(r"`(\w+)`", m.group(1))) == methods.DEFAULT_BASELINES


# --------------------------------------------------------------------------- defaults
def test_segtree_defaults_sentence() -> None:
    seg = _memory_classes()["SegTreeMem"]
    text = _prose(DOCS / "evaluation.md").replace("\n", " ")
    m = re.search(r"Defaults \(chosen on .*?\): (.*?)\. The paper", text)
    assert m, "docs/evaluation.md: SegTreeMem's 'Defaults (chosen on ...): ...' sentence is gone"
    s = m.group(1)
    found = {
        "threshold": re.search(r"cosine threshold ([\d.]+)", s).group(1),
        "branching": re.search(r"`branching=(\w+)`", s).group(1),
        "hybrid_weight": re.search(r"weight ([\d.]+)\)", s).group(1),
        "alpha": re.search(r"α = ([\d.]+)", s).group(1),
        "horizon": re.search(r"H = (\d+)", s).group(1),
        "admissible": re.search(r"(\w+) as the admissible set", s).group(1),
        "top_down_weights": re.search(r'`top_down_weights="(\w+)"`', s).group(1),
    }
    assert re.search(r"^hybrid relevance", s.split(", ")[2])  # the third item names the relevance
    for name, value in found.items():
        code = _default(seg, name)
        assert str(code) == value, f"docs/evaluation.md: {name} = {value}, SegTreeMem's default is {code!r}"
    assert _default(seg, "relevance") == "hybrid"
    assert re.search(r"`(\w+)` retrieval", s).group(1) == seg.default_policy
    m = re.search(r"`max_children=(\d+)` \(the default", text)
    assert m and int(m.group(1)) == _default(seg, "max_children")


def test_hiermem_block_arguments_table() -> None:
    from llamaindex_hiermem import HierMemBlock

    text = _prose(DOCS / "llamaindex.md")
    rows = re.findall(r"^\| (`\w+=`(?:, `\w+=`)*) \| ([^|]+) \|", text, re.M)
    assert rows, "docs/llamaindex.md: the HierMemBlock argument table is gone"
    fields = HierMemBlock.model_fields
    for names_cell, default_cell in rows:
        names = re.findall(r"`(\w+)=`", names_cell)
        defaults = re.findall(r"`([^`]+)`", default_cell)
        for name, shown in zip(names, defaults if len(defaults) == len(names) else defaults[:1] * len(names)):
            assert name in fields, f"HierMemBlock has no argument {name}"
            field = fields[name]
            default = field.default_factory() if field.default_factory else field.default
            try:
                expected = ast.literal_eval(shown)
            except (ValueError, SyntaxError):
                continue  # a description of the default (e.g. `(name,)`, computed at construction)
            assert default == expected, f"HierMemBlock {name}= defaults to {default!r}, the docs say {shown}"


def test_middleware_options_bullet() -> None:
    from langchain_hiermem.middleware import HierMemMiddleware

    text = _prose(DOCS / "langchain.md").replace("\n", " ")
    m = re.search(r"\*\*Options\.\*\* (.*?)\. - \*\*", text)
    assert m, "docs/langchain.md: the middleware's **Options.** bullet is gone"
    params = inspect.signature(HierMemMiddleware.__init__).parameters
    named = [n for n in re.findall(r"`(\w+)`", m.group(1)) if n[0].islower()]  # not None, classes
    for name in named:
        assert name in params, f"HierMemMiddleware has no option {name}"
    for name, value in re.findall(r"`(\w+)` \([^)]*?default (\d+)", m.group(1)):
        assert params[name].default == int(value), f"{name}: docs {value}, code {params[name].default}"


def test_mcp_tools_list() -> None:
    """docs/mcp.md's bullet list of MCP tools: every registered tool, with its parameters and defaults."""
    from shared_core.serve import mcp_server

    text = _prose(DOCS / "mcp.md").replace("\n", " ")
    start = text.index("Tools (bad arguments come back as tool errors")
    listed = re.findall(r"- `(\w+)\(([^)]*)\)` →", text[start : text.index("## ", start)])
    registered = re.findall(r"add_tool\(\s*tools\.(\w+)", inspect.getsource(mcp_server.build_server))
    assert [name for name, _ in listed] == registered
    for name, args in listed:
        params = list(inspect.signature(getattr(mcp_server.HierMemTools, name)).parameters.values())[1:]
        shown = [a.strip() for a in args.split(",") if a.strip()]
        assert [s.split("=")[0] for s in shown] == [p.name for p in params], f"{name}: {shown} vs {params}"
        for s, p in zip(shown, params):
            if "=" in s:
                assert ast.literal_eval(s.split("=", 1)[1]) == p.default, f"{name}: {s} vs {p}"
            else:
                assert p.default is inspect.Parameter.empty, f"{name}: {p.name} has a default"


def test_extras_named_in_the_docs_exist() -> None:
    """Every ``hiermem[extra,...]`` of the docs is an extra of pyproject.toml, and docs/langchain.md's
    extras table names classes that ``langchain_hiermem`` exports."""
    import langchain_hiermem

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = set(tomllib.loads(_text(ROOT / "pyproject.toml"))["project"]["optional-dependencies"])
    named = set()
    for path in DOC_FILES:
        for group in re.findall(r"hiermem\[([\w,-]+)\]", _text(path)):
            named.update(group.split(","))
    assert named and named <= extras, f"extras the docs name but pyproject.toml lacks: {named - extras}"
    table = re.findall(r"^\| `hiermem\[(\w+)\]` \| [^|]+ \| ([^|]+) \|$", _text(DOCS / "langchain.md"), re.M)
    assert {extra for extra, _ in table} == {"langchain", "agents", "legacy"}
    for _, gives in table:
        for name in re.findall(r"`(\w+)`", gives):
            assert name in langchain_hiermem.__all__, f"langchain_hiermem does not export {name}"
