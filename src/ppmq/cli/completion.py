"""Shell completion of `ppmq` for bash and zsh, generated from the command line's
own argparse parser, so that a new command or option completes as soon as it exists.

    python -m ppmq.cli.completion bash > /usr/share/bash-completion/completions/ppmq
    python -m ppmq.cli.completion zsh > /usr/share/zsh/vendor-completions/_ppmq
    python -m ppmq.cli.completion --install STAGE   # both, under STAGE/usr/share

Both complete the commands (and `bridge to|from`), each command's options, the
values of an option with choices (`peek --state`), and file names where a file
is asked for (-c, -s, `listen SOCKET`, `report JOURNAL_PATH`). Topic and
subscriber names are not completed: they live in the config and the broker.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

# The arguments whose values are file names, by their argparse dest.
FILE_DESTS = frozenset({"config", "socket", "path", "paths", "out"})
BASH_PATH = Path("usr/share/bash-completion/completions/ppmq")
ZSH_PATH = Path("usr/share/zsh/vendor-completions/_ppmq")
HELP_CHARS = 70  # of a description zsh shows beside a command or an option


@dataclass
class Option:
    names: list[str]
    help: str
    takes_value: bool
    repeats: bool  # may be given more than once (action="append")
    metavar: str
    choices: list[str] | None
    files: bool


@dataclass
class Positional:
    metavar: str
    many: bool  # nargs + or *
    choices: list[str] | None
    files: bool


@dataclass
class Node:
    """A command (or the program itself) as the completions see it."""

    path: list[str]  # [] for ppmq, ["bridge", "to"] for `ppmq bridge to`
    options: list[Option] = field(default_factory=list)
    positionals: list[Positional] = field(default_factory=list)
    commands: dict[str, tuple[str, Node]] = field(default_factory=dict)  # name: (help, node)


def tree(parser: argparse.ArgumentParser, path: list[str] | None = None) -> Node:
    """The parser's commands, options and arguments (argparse keeps no public list of them)."""
    node = Node(path or [])
    for action in parser._actions:
        choices = [str(c) for c in action.choices] if action.choices is not None else None
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                node.commands[name] = (helps.get(name, ""), tree(sub, [*node.path, name]))
        elif action.option_strings:
            node.options.append(
                Option(
                    names=list(action.option_strings),
                    help=(action.help or "").replace("%%", "%"),
                    takes_value=action.nargs != 0,
                    repeats=isinstance(action, argparse._AppendAction),
                    metavar=_metavar(action),
                    choices=choices,
                    files=action.dest in FILE_DESTS,
                )
            )
        else:
            many = action.nargs in ("+", "*", argparse.REMAINDER)
            node.positionals.append(Positional(_metavar(action), many, choices, action.dest in FILE_DESTS))
    return node


def _metavar(action: argparse.Action) -> str:
    if isinstance(action.metavar, tuple):
        return " ".join(action.metavar)
    return action.metavar or action.dest.upper()


def _nodes(node: Node) -> list[Node]:
    """The node and every node under it, parents first."""
    return [node, *(n for _, (_, sub) in node.commands.items() for n in _nodes(sub))]


def _short(text: str) -> str:
    """A description on one line, cut to HELP_CHARS."""
    text = " ".join(text.split())
    return text if len(text) <= HELP_CHARS else text[: HELP_CHARS - 3].rstrip() + "..."


# --- bash ------------------------------------------------------------------------------------


def bash(root: Node) -> str:
    """A bash completion file: `complete -F _ppmq ppmq`. It walks the words typed so
    far to find the command (skipping the value of each option that takes one), then
    offers that command's subcommands, options, an option's choices, or file names."""
    nodes, choices = [], []
    for node in _nodes(root):
        valued = [n for o in node.options if o.takes_value for n in o.names]
        files = [n for o in node.options if o.files and o.takes_value for n in o.names]
        file_args = int(any(p.files for p in node.positionals))
        options = [n for o in node.options for n in o.names]
        nodes.append(
            f'        "{" ".join(node.path)}")\n'
            f'            commands="{" ".join(node.commands)}"\n'
            f'            options="{" ".join(options)}"\n'
            f'            valued="{" ".join(valued)}"\n'
            f'            files="{" ".join(files)}"\n'
            f"            file_args={file_args}\n"
            f"            ;;"
        )
        for o in node.options:
            if o.choices:
                for name in o.names:
                    choices.append(f'        "{" ".join(node.path)}|{name}") echo "{" ".join(o.choices)}" ;;')
    return _BASH.format(nodes="\n".join(nodes), choices="\n".join(choices))


_BASH = """\
# bash completion for ppmq, generated from its argument parser by `python -m ppmq.cli.completion bash`.

# _ppmq_node PATH: the command PATH's subcommands, options, options that take a value,
# options whose value is a file, and whether its arguments are files.
_ppmq_node() {{
    case $1 in
{nodes}
    esac
}}

# _ppmq_choices PATH OPTION: the values OPTION of the command PATH accepts, if it names them.
_ppmq_choices() {{
    case "$1|$2" in
{choices}
    esac
}}

_ppmq() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD - 1]}}
    local commands options valued files file_args path="" word i skip=0
    _ppmq_node ""
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${{COMP_WORDS[i]}}
        if ((skip)); then
            skip=0
        elif [[ $word == -* ]]; then
            [[ $word != *=* && " $valued " == *" $word "* ]] && skip=1
        elif [[ " $commands " == *" $word "* ]]; then
            path=${{path:+$path }}$word
            _ppmq_node "$path"
        fi
    done
    COMPREPLY=()
    if ((skip)); then
        local values
        values=$(_ppmq_choices "$path" "$prev")
        if [[ -n $values ]]; then
            mapfile -t COMPREPLY < <(compgen -W "$values" -- "$cur")
        elif [[ " $files " == *" $prev "* ]]; then
            compopt -o filenames 2>/dev/null
            mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        fi
    elif [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$options" -- "$cur")
    elif [[ -n $commands ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$commands" -- "$cur")
    elif ((file_args)); then
        compopt -o filenames 2>/dev/null
        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
    fi
    return 0
}}
complete -F _ppmq ppmq
"""


# --- zsh -------------------------------------------------------------------------------------


def zsh(root: Node) -> str:
    """A zsh completion file (#compdef ppmq): one function a command, each an
    _arguments of its options and arguments; a command with subcommands hands
    the rest of the line to the chosen one's function."""
    functions = [_zsh_function(node) for node in reversed(_nodes(root))]
    header = "#compdef ppmq\n# zsh completion for ppmq, generated from its argument parser by `python -m ppmq.cli.completion zsh`.\n"
    return header + "\n".join(functions) + '\n_ppmq_main "$@"\n'


def _zsh_name(node: Node) -> str:
    return "_ppmq_" + ("_".join(node.path).replace("-", "_") or "main")


def _q(text: str) -> str:
    """A word in single quotes for zsh."""
    return "'" + text.replace("'", "'\\''") + "'"


def _colons(text: str) -> str:
    """Colons separate the parts of an _arguments spec: one in a part is escaped."""
    return text.replace(":", "\\:")


def _zsh_action(choices: list[str] | None, files: bool) -> str:
    if choices:
        return "(" + " ".join(choices) + ")"
    return "_files" if files else " "


def _zsh_specs(node: Node) -> list[str]:
    specs = []
    for o in node.options:
        description = _short(o.help).replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")
        if o.names[0] in ("-h", "--help") or "--version" in o.names:
            exclude = "(- *)"  # nothing else after them
        elif o.repeats:
            exclude = "*"
        else:
            exclude = "(" + " ".join(o.names) + ")"
        value = f":{_colons(o.metavar)}:{_zsh_action(o.choices, o.files)}" if o.takes_value else ""
        specs += [_q(f"{exclude}{name}[{description}]{value}") for name in o.names]
    for number, p in enumerate(node.positionals, 1):
        position = "*" if p.many else str(number)
        specs.append(_q(f"{position}:{_colons(p.metavar)}:{_zsh_action(p.choices, p.files)}"))
    return specs


_CONTINUED = " \\\n        "  # the next spec of an _arguments, on a line of its own


def _zsh_function(node: Node) -> str:
    specs = _zsh_specs(node)
    name = _zsh_name(node)
    if not node.commands:
        if not node.positionals and all(o.names[0] == "-h" for o in node.options):
            specs.append(_q("*:: :_default"))  # a program with a parser of its own (`ppmq bench`)
        return f"{name}() {{\n    _arguments -S \\\n        " + _CONTINUED.join(specs) + "\n}\n"
    specs += [_q("1:command:->command"), _q("*::argument:->argument")]
    described = "\n".join(f"        {_q(_colons(sub) + ':' + _short(help))}" for sub, (help, _) in node.commands.items())
    cases = "\n".join(f"        {sub}) {_zsh_name(child)} && ret=0 ;;" for sub, (_, child) in node.commands.items())
    title = " ".join(["ppmq", *node.path])
    joined = _CONTINUED.join(specs)
    return f"""{name}() {{
    local curcontext=$curcontext state state_descr line ret=1
    typeset -A opt_args
    _arguments -C -S \\
        {joined} && ret=0
    case $state in
    command)
        local -a commands=(
{described}
        )
        _describe -t commands {_q(title + " command")} commands && ret=0
        ;;
    argument)
        curcontext=${{curcontext%:*:*}}:{"-".join(["ppmq", *node.path])}-$words[1]:
        case $words[1] in
{cases}
        esac
        ;;
    esac
    return ret
}}
"""


# --- writing them ---------------------------------------------------------------------------


def scripts() -> dict[Path, str]:
    """Both files, by where a package installs them (relative to /)."""
    from ppmq.cli.main import _parser  # the command line's own parser

    root = tree(_parser()[0])
    return {BASH_PATH: bash(root), ZSH_PATH: zsh(root)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ppmq.cli.completion", description="write ppmq's completion for bash or zsh")
    ap.add_argument("shell", nargs="?", choices=("bash", "zsh"), help="print this shell's completion on stdout")
    ap.add_argument("--install", type=Path, metavar="ROOT", help="write both under ROOT, as a package installs them under /")
    args = ap.parse_args(argv)
    if (args.shell is None) == (args.install is None):
        ap.error("name a shell or --install ROOT")
    made = scripts()
    if args.shell is not None:
        sys.stdout.write(made[BASH_PATH if args.shell == "bash" else ZSH_PATH])
        return 0
    for path, text in made.items():
        out = args.install / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
