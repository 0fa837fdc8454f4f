#!/usr/bin/env python3
"""Check the relative links of the documentation (scripts/check-docs runs it).

Every Markdown file given (directories: every *.md below them) is read for links: inline
links and images `[text](target)`, reference definitions `[ref]: target`, HTML `href=` and
`src=`; fenced code blocks and code spans are skipped. A link with a scheme (https:, mailto:)
is not followed. Any other link must name a file or directory that exists on disk, relative
to the file that links (a page of the book may link outside it, e.g. ../BENCHMARKS.md); a
`#anchor` must be a heading of the target Markdown file (or of the file itself), as GitHub
and mdBook name headings: lower case, letters, digits, `-` and `_` kept, spaces as `-`,
`-1`, `-2` for repeats; `<a id=...>`/`<a name=...>` count too.

With --summary FILE, every Markdown file in FILE's directory tree must also be listed there
(mdBook builds only what SUMMARY.md lists).

Exit status 1 and one line per broken link (file:line: target: why) when any is broken.
"""

import os
import re
import sys

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
INLINE = re.compile(r"(!?)(?<!\\)\[((?:[^\[\]\\]|\\.|\[(?:[^\[\]\\]|\\.)*\])*)\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
HTMLATTR = re.compile(r"""<[a-zA-Z][^>]*?\s(?:href|src)\s*=\s*["']([^"']*)["']""")
HTMLID = re.compile(r"""<a\s[^>]*?(?:id|name)\s*=\s*["']([^"']+)["']""")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def blank_code(lines):
    """The lines with fenced code blocks and code spans blanked out (line numbers kept)."""
    out = []
    fence = None
    for line in lines:
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)):].strip():
                fence = None
            out.append("")
            continue
        if m:
            fence = m.group(1)
            out.append("")
            continue
        if line.startswith("    ") or line.startswith("\t"):
            # an indented code block, or a list item's continuation: keep, spans blanked
            pass
        out.append(line)
    text = "\n".join(out)
    # code spans: a run of backticks up to the next run of the same length
    result = []
    i = 0
    while i < len(text):
        if text[i] == "`" and (i == 0 or text[i - 1] != "\\"):
            j = i
            while j < len(text) and text[j] == "`":
                j += 1
            run = text[i:j]
            k = j
            close = -1
            while True:
                k = text.find(run, k)
                if k < 0:
                    break
                end = k + len(run)
                if (k == 0 or text[k - 1] != "`") and (end >= len(text) or text[end] != "`"):
                    close = k
                    break
                while k < len(text) and text[k] == "`":
                    k += 1
            if close >= 0:
                span = text[i:close + len(run)]
                result.append(re.sub(r"[^\n]", " ", span))
                i = close + len(run)
                continue
            result.append(run)
            i = j
            continue
        result.append(text[i])
        i += 1
    return "".join(result)


def plain(heading):
    """A heading's text as rendered: no code ticks, emphasis, links, tags or escapes."""
    t = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    t = re.sub(r"<[^>]+>", "", t)
    t = t.replace("`", "")
    t = re.sub(r"\*+", "", t)
    t = re.sub(r"(?<![A-Za-z0-9])_+|_+(?![A-Za-z0-9])", "", t)
    t = re.sub(r"\\(.)", r"\1", t)
    t = t.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return t.strip()


def slug(text):
    out = []
    for c in plain(text).lower():
        if c.isalnum() or c in "-_":
            out.append(c)
        elif c == " ":
            out.append("-")
    return "".join(out)


_anchors = {}


def anchors(path):
    if path in _anchors:
        return _anchors[path]
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    seen = {}
    found = set()
    fence = None
    prev = ""
    for line in lines:
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            prev = ""
            continue
        if m:
            fence = m.group(1)
            prev = ""
            continue
        text = None
        h = HEADING.match(line)
        if h:
            text = h.group(2)
        elif prev.strip() and SETEXT.match(line) and not HEADING.match(prev) and not prev.lstrip().startswith(("-", "*", "|", ">")):
            text = prev.strip()
        if text is not None:
            base = slug(text)
            n = seen.get(base, 0)
            found.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
        for a in HTMLID.findall(line):
            found.add(a)
        prev = line
    _anchors[path] = found
    return found


def links(path):
    with open(path, encoding="utf-8") as f:
        text = blank_code(f.read().split("\n"))
    for m in INLINE.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(3).strip("<>")
    for m in REFDEF.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1).strip("<>")
    for m in HTMLATTR.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1)


def check(path):
    broken = []
    for line, target in links(path):
        if not target or SCHEME.match(target) or target.startswith("//"):
            continue
        file_part, _, anchor = target.partition("#")
        file_part = re.sub(r"%20", " ", file_part)
        if file_part:
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            if not os.path.exists(dest):
                broken.append(f"{path}:{line}: {target}: no such file ({dest})")
                continue
        else:
            dest = path
        if anchor and os.path.isfile(dest) and dest.endswith(".md"):
            if anchor not in anchors(dest):
                broken.append(f"{path}:{line}: {target}: no heading #{anchor} in {dest}")
    return broken


def markdown_files(paths):
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for name in sorted(files):
                    if name.endswith(".md"):
                        yield os.path.join(root, name)
        else:
            yield p


def main(argv):
    summary = None
    if len(argv) >= 2 and argv[0] == "--summary":
        summary, argv = argv[1], argv[2:]
    files = list(markdown_files(argv))
    broken = []
    for f in files:
        broken.extend(check(f))
    if summary:
        book = os.path.dirname(summary) or "."
        listed = set()
        for _, target in links(summary):
            if not SCHEME.match(target):
                listed.add(os.path.normpath(os.path.join(book, target.partition("#")[0])))
        for f in markdown_files([book]):
            if os.path.normpath(f) not in listed and os.path.normpath(f) != os.path.normpath(summary):
                broken.append(f"{summary}: does not list {f}")
    for b in broken:
        print(b)
    if broken:
        print(f"check-links: {len(broken)} broken link(s) in {len(files)} files", file=sys.stderr)
        return 1
    print(f"check-links: {len(files)} files, every relative link and anchor resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
