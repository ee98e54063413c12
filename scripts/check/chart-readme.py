#!/usr/bin/env python3
"""Writes the values table of charts/kiln/README.md from the comments of charts/kiln/values.yaml,
or with --check fails when the committed table differs from what it would write.

Every key of values.yaml is one row, in the file's order: its dotted path, its default and the
comment above it, joined into one line. charts/kiln/values.schema.json decides what a key is: an
object the schema closes (`additionalProperties: false`) is a section, whose own comment is a
row with no default and whose keys follow; anything else (a scalar, a list, a free-form map such
as `resources` or `nodeSelector`) is one value, its default written in YAML flow style. A key of
values.yaml the schema does not name, a schema property values.yaml lacks, or a key without a
comment is an error, so the file, its schema and the README cannot drift apart unseen.

Only the part of the README between the two marker lines (BEGIN and END below) is written; the
prose around it is edited by hand. The standard library only: this runs in scripts/test.sh's
first phase, before any package is installed. values.yaml is read with a parser for the subset
of YAML it uses (block maps and lists by indentation, flow values on one line, `#` comments), and
anything outside that subset is refused with its line number.

Usage: scripts/check/chart-readme.py [--check] [CHART_DIR]   (default: charts/kiln of this repository)
Exit status 1 when --check finds a difference or the files are inconsistent, 0 otherwise.
"""

import difflib
import json
import os
import re
import sys

BEGIN = "<!-- values: written by scripts/check/chart-readme.py from values.yaml; edit values.yaml, not this table -->"
END = "<!-- end of values -->"

KEY = re.compile(r"^( *)([A-Za-z_][\w.-]*):(?: +(.*))?$")
ITEM = re.compile(r"^( *)- +(.*)$")


class Error(Exception):
    """values.yaml, the schema or the README is not as this script needs it."""


class Line:
    """One line of values.yaml that holds a key or a list item."""

    def __init__(self, number, indent, key, text, comment):
        self.number, self.indent, self.key, self.text, self.comment = number, indent, key, text, comment


def strip_comment(text):
    """`text` less a trailing ` # comment` (outside quotes)."""
    quote = None
    for i, c in enumerate(text):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] == " "):
            return text[:i].rstrip()
    return text


def lex(text):
    """The key and item lines of a values file, each with the comment block right above it."""
    lines, comment = [], []
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped:
            comment = []  # a blank line ends a comment block: the file's header is no key's
        elif stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
        elif m := ITEM.match(raw):
            lines.append(Line(number, len(m.group(1)), None, strip_comment(m.group(2)), comment))
            comment = []
        elif m := KEY.match(raw):
            value = strip_comment(m.group(3) or "")
            if value[:1] in ("|", ">", "&", "*", "!"):
                raise Error(f"values.yaml:{number}: block scalars, anchors and tags are not supported here")
            lines.append(Line(number, len(m.group(1)), m.group(2), value, comment))
            comment = []
        else:
            raise Error(f"values.yaml:{number}: not a `key: value` or `- item` line: {raw!r}")
    return lines


class Node:
    """A key of values.yaml: its comment and either an inline value or the lines of its block."""

    def __init__(self, line, children):
        self.line, self.children = line, children


def tree(lines, start, indent):
    """The nodes at `indent` from lines[start:], as (list of Node, next index). A key's block is
    the lines after it indented more deeply (a list may sit at the key's own indent, as YAML
    allows)."""
    nodes, i = [], start
    while i < len(lines) and lines[i].indent >= indent:
        line = lines[i]
        if line.indent > indent or line.key is None:
            raise Error(f"values.yaml:{line.number}: unexpected indentation or list item")
        j = i + 1
        while j < len(lines) and (lines[j].indent > indent or (lines[j].indent == indent and lines[j].key is None)):
            j += 1
        nodes.append(Node(line, lines[i + 1:j]))
        i = j
    return nodes, i


def flow(line, block):
    """The value of a key in YAML flow style: its inline text, or its block converted."""
    if line.text:
        if block:
            raise Error(f"values.yaml:{block[0].number}: a value both inline and as a block")
        return line.text
    if not block:
        return "null"
    return block_flow(block)


def block_flow(block):
    """A block (map or list lines, all at one indent and deeper) in YAML flow style."""
    indent = block[0].indent
    parts, i = [], 0
    while i < len(block):
        line = block[i]
        if line.indent != indent:
            raise Error(f"values.yaml:{line.number}: unexpected indentation")
        j = i + 1
        while j < len(block) and block[j].indent > indent:
            j += 1
        inner = block[i + 1:j]
        if line.key is None:  # `- item`: an inline value, or a map begun on the item's line
            m = KEY.match(" " * (indent + 2) + line.text)
            if m and (inner or not line.text.startswith(("{", "[", "'", '"'))):
                first = Line(line.number, indent + 2, m.group(2), strip_comment(m.group(3) or ""), [])
                parts.append(block_flow([first] + inner))
            elif inner:
                raise Error(f"values.yaml:{inner[0].number}: unexpected indentation")
            else:
                parts.append(line.text)
        else:
            parts.append(f"{line.key}: {flow(line, inner)}")
        i = j
    is_list = block[0].key is None
    if any((b.key is None) != is_list for b in block if b.indent == indent):
        raise Error(f"values.yaml:{block[0].number}: map keys and list items mixed at one level")
    return ("[%s]" if is_list else "{%s}") % ", ".join(parts)


def resolve(schema, node):
    """A schema node with its `$ref` (to #/definitions/NAME) followed."""
    while "$ref" in node:
        name = node["$ref"].removeprefix("#/definitions/")
        node = schema["definitions"][name]
    return node


def is_section(node):
    return node.get("type") == "object" and node.get("additionalProperties") is False


def rows(nodes, schema, node, prefix=""):
    """(key, default or None for a section, description) for every key, in the file's order."""
    props = node.get("properties", {})
    seen, out = set(), []
    for n in nodes:
        key, line = prefix + n.line.key, n.line
        if not line.comment:
            raise Error(f"values.yaml:{line.number}: {key} has no comment: say what it does above it")
        if n.line.key not in props:
            raise Error(f"values.yaml:{line.number}: {key} is not in values.schema.json: add it there")
        seen.add(n.line.key)
        description = " ".join(line.comment)
        sub = resolve(schema, props[n.line.key])
        if is_section(sub) and not line.text:
            children, end = tree(n.children, 0, n.children[0].indent if n.children else 0)
            if end != len(n.children):
                raise Error(f"values.yaml:{n.children[end].number}: unexpected indentation")
            out.append((key, None, description))
            out += rows(children, schema, sub, key + ".")
        else:
            out.append((key, flow(line, n.children), description))
    missing = sorted(set(props) - seen)
    if missing:
        raise Error(f"values.schema.json names {', '.join(prefix + m for m in missing)}, which values.yaml lacks")
    return out


def cell(text):
    """Text for one Markdown table cell."""
    return text.replace("|", "\\|")


def table(chart):
    """The generated part of the README: the marker lines and the table between them."""
    with open(os.path.join(chart, "values.yaml"), encoding="utf-8") as f:
        lines = lex(f.read())
    with open(os.path.join(chart, "values.schema.json"), encoding="utf-8") as f:
        schema = json.load(f)
    nodes, end = tree(lines, 0, 0)
    if end != len(lines):
        raise Error(f"values.yaml:{lines[end].number}: unexpected indentation")
    out = [BEGIN, "", "| key | default | description |", "|---|---|---|"]
    for key, default, description in rows(nodes, schema, schema):
        shown = "" if default is None else f"`{cell(default)}`"
        out.append(f"| `{key}` | {shown} | {cell(description)} |")
    return "\n".join(out + ["", END])


def render(readme, chart):
    """The README with its generated part replaced."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise Error(f"README.md must hold the line {BEGIN!r} once, then {END!r} once")
    head, rest = readme.split(BEGIN, 1)
    return head + table(chart) + rest.split(END, 1)[1]


def main(argv):
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    if len(args) > 1 or any(a.startswith("-") for a in args):
        print(__doc__, file=sys.stderr)
        return 2
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    chart = args[0] if args else os.path.join(repo, "charts", "kiln")
    path = os.path.abspath(os.path.join(chart, "README.md"))
    name = os.path.relpath(path, repo)  # in messages: as the repository names it, when inside
    name = path if name.startswith("..") else name
    try:
        with open(path, encoding="utf-8") as f:
            old = f.read()
        new = render(old, chart)
    except (Error, OSError, ValueError) as e:
        print(f"chart-readme: {e}", file=sys.stderr)
        return 1
    if check:
        if old != new:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), name, "regenerated"))
            print(f"chart-readme: {name} is stale: run scripts/check/chart-readme.py and commit the result", file=sys.stderr)
            return 1
        print(f"chart-readme: {name} matches values.yaml and values.schema.json")
        return 0
    if old != new:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
        print(f"chart-readme: wrote {name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
