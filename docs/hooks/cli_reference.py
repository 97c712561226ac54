"""MkDocs hook: the command-line reference (`cli.md`), generated at build time from the typer application's click
command tree (`prunetrain.cli.app`), so every command, argument and option is on the page as the code defines it.

Nothing is run but the import of `prunetrain.cli`; tests/test_docs.py checks the page against the same tree. Typer
carries its own copy of click (`typer._click`), so the tree is read by duck typing: a group has `commands`, an argument
has `param_type_name == "argument"`.
"""

from __future__ import annotations

import inspect


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _is_argument(param) -> bool:
    return param.param_type_name == "argument"


def _default(param) -> str:
    default = param.default
    if param.required or default is None or callable(default) or repr(default).startswith("<"):
        return ""
    if getattr(param, "is_flag", False) and not default:
        return ""
    if isinstance(default, (list, tuple, str)) and not default:
        return ""
    return f"`{default}`"


def _params(command, ctx) -> list[str]:
    rows = []
    for param in command.params:
        if getattr(param, "hidden", False) or param.name == "help":
            continue
        if _is_argument(param):
            name = f"`{param.name.upper()}`"
        else:
            name = ", ".join(f"`{opt}`" for opt in [*param.opts, *param.secondary_opts])
        kind = "argument" if _is_argument(param) else ("flag" if getattr(param, "is_flag", False)
                                                        else _cell(param.display_type(ctx).strip("<>")))
        required = "yes" if param.required else ""
        rows.append(f"| {name} | {kind} | {required} | {_default(param)} | {_cell(getattr(param, 'help', '') or '')} |")
    if not rows:
        return []
    return ["| name | type | required | default | meaning |", "|---|---|---|---|---|", *rows]


def _summary(command, limit: int = 160) -> str:
    """The help's first paragraph, cut at a word before `limit` characters."""
    text = _cell(inspect.cleandoc(command.help or "").split("\n\n")[0])
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def walk(group, prefix: str = "prunetrain"):
    """(`prunetrain sub ...` path, click command) for every command under `group`, in the order `--help` lists them."""
    for name, command in group.commands.items():
        path = f"{prefix} {name}"
        yield path, command
        if hasattr(command, "commands"):
            yield from walk(command, path)


def root_command():
    import typer

    from prunetrain.cli import app

    return typer.main.get_command(app)


def cli_markdown() -> str:
    """The whole reference page as Markdown."""
    root = root_command()
    lines = ["# Command line", "",
             ("Generated from the `prunetrain` command itself (typer; `docs/hooks/cli_reference.py`) when the site is "
             "built: every command, argument and option, with its help. `prunetrain COMMAND --help` prints the same. "
             "Errors in what you give are one line on stderr naming the flag, exit code 2 (`PRUNETRAIN_DEBUG=1` "
             "shows the original exception); a run that diverged exits with code 1."), ""]
    lines += ["| command | what it does |", "|---|---|"]
    commands = list(walk(root))
    for path, command in commands:
        anchor = path.replace(" ", "-")
        lines.append(f"| [`{path}`](#{anchor}) | {_summary(command)} |")
    for path, command in commands:
        anchor = path.replace(" ", "-")
        lines += ["", f"## `{path}` {{#{anchor}}}", "", inspect.cleandoc(command.help or "").replace("\b\n", ""), ""]
        if hasattr(command, "commands"):
            lines.append("Subcommands: " + ", ".join(f"[`{path} {name}`](#{anchor}-{name})"
                                                     for name in command.commands) + ".")
            continue
        ctx = command.context_class(command, info_name=path)
        usage = " ".join(command.collect_usage_pieces(ctx))
        lines += ["```text", f"{path} {usage}", "```", "", *_params(command, ctx)]
    return "\n".join(lines) + "\n"


def on_files(files, config):
    """MkDocs event: add the generated `cli.md` to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, "cli.md", content=cli_markdown()))
    return files
