"""README's Layout section against the files: every module is named at its own path, and every
path it names exists.

A name is read with the folders it is indented under, so that `loss.py` in training/ is not
taken as named by `output_loss.py`, nor run/loading.py by export/loading.py.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).parents[1]
DESCRIPTION_COLUMN = 20  # a line indented this far continues the description above it
COMMANDS = "jaxformer/commands/"  # lists its modules by name in its description, not one a line


def layout_tree(readme: str) -> str:
    layout = readme[readme.index("## Layout") :]
    start = layout.index("```text\n") + len("```text\n")
    return layout[start : layout.index("```", start)]


def listed_paths(tree: str) -> dict[str, str]:
    """Each path the tree names (folders end with /), with its description (continuations joined)."""
    listed: dict[str, str] = {}
    folders: list[tuple[int, str]] = []  # (indentation, folder) of the folders enclosing the line
    last: list[str] = []
    for line in tree.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent >= DESCRIPTION_COLUMN:
            for path in last:
                listed[path] += " " + line.strip()
            continue
        names, _, description = re.match(r"([^\s,]+(?:, [^\s,]+)*)(\s+(.*))?$", line.strip()).groups()
        while folders and folders[-1][0] >= indent:
            folders.pop()
        prefix = "".join(folder for _, folder in folders)
        last = [prefix + name for name in names.split(", ")]
        listed.update(dict.fromkeys(last, description or ""))
        if names.endswith("/"):
            folders.append((indent, names))
    return listed


def modules_to_name() -> list[str]:
    """The files Layout lists: the package's and the benchmarks' modules (the shipped configs and
    sweeps by their folders), the scripts at the top of a clone and the docs."""
    paths = [
        *sorted((ROOT / "jaxformer").rglob("*.py")),
        *sorted((ROOT / "benchmarks").glob("*.py")),
        *sorted(ROOT.glob("*.py")),
        *sorted((ROOT / "docs").glob("*.md")),
    ]
    return [
        path.relative_to(ROOT).as_posix()
        for path in paths
        if path.name != "__init__.py" and "configs" not in path.relative_to(ROOT).parts
    ]


def unnamed_modules(listed: dict[str, str]) -> list[str]:
    commands_words = set(re.findall(r"\w+", listed.get(COMMANDS, "")))
    return [
        path
        for path in modules_to_name()
        if path not in listed
        and not (path.startswith(COMMANDS) and path.count("/") == 2 and pathlib.Path(path).stem in commands_words)
    ]


def test_the_readme_layout_names_every_module_at_its_path():
    listed = listed_paths(layout_tree((ROOT / "README.md").read_text()))
    assert not unnamed_modules(listed), f"README's Layout does not name {unnamed_modules(listed)}"


def test_every_path_the_readme_layout_names_exists():
    listed = listed_paths(layout_tree((ROOT / "README.md").read_text()))
    assert len(listed) > 100  # the tree was read
    missing = [path for path in listed if not (ROOT / path).exists()]
    assert not missing, f"README's Layout names {missing}, which do not exist"


def test_a_module_named_only_inside_another_name_is_unnamed():
    tree = (
        "jaxformer/\n"
        "  training/\n"
        "    output_loss.py      the output projection fused with the loss\n"
        "  export/\n"
        "    loading.py          load_export\n"
        "  commands/             train, translate (argparse; common.py: flags,\n"
        "                        errors)\n"
    )
    listed = listed_paths(tree)
    assert "jaxformer/training/loss.py" not in listed
    assert "jaxformer/run/loading.py" not in listed
    assert listed["jaxformer/commands/"] == "train, translate (argparse; common.py: flags, errors)"
    unnamed = unnamed_modules(listed)
    assert {"jaxformer/training/loss.py", "jaxformer/run/loading.py", "jaxformer/commands/evaluate.py"} <= set(unnamed)
    assert not {"jaxformer/commands/train.py", "jaxformer/commands/common.py"} & set(unnamed)
