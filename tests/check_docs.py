"""Checks of the documentation, for tests/test_docs.sh:

  check_docs.py links ROOT [FILE...]
      Every link in README.md and docs/**/*.md under ROOT (or in the FILEs
      given, paths relative to ROOT): a relative link must name a file or
      folder of the tree, and its #anchor a heading of the target (GitHub's
      rules: the heading's text lowercased, punctuation but '-' and '_'
      dropped, each space a '-', the second of a name '-1', the third '-2',
      ...; <a name=...> and id=... count too; #L10 or #L10-L20 in a file that
      is not markdown: lines it has). http(s) links are not fetched: they
      must be well-formed (a host, no spaces). Prints FILE:LINE: LINK: WHY per
      broken link; exits 1 if any.
  check_docs.py slug TEXT...
      Prints the anchor of each heading text, in order (duplicates numbered).
  check_docs.py help-agree BIN_DIR
      The trainer's and pserver's --help and its markdown form
      (PSTRAIN_HELP_FORMAT=markdown) list the same flags, with the same
      argument, variable, default and text, in the same order.
"""
import os
import re
import subprocess
import sys
import unicodedata
import urllib.parse

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
HTML_ANCHOR = re.compile(r"""<a\s[^>]*?(?:name|id)\s*=\s*["']([^"']+)["']""", re.I)
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target): the target may hold one level of
# parentheses, or be written <like this>.
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"  # [text], one level of [nested] brackets
    r"\(\s*(<[^>]*>|(?:[^()\s]|\([^()\s]*\))*)"  # (target
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")  # "title")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]*)>", re.I)
HTML_LINK = re.compile(r"""<(?:a|img)\s[^>]*?(?:href|src)\s*=\s*["']([^"']*)["']""", re.I)
LINE_ANCHOR = re.compile(r"^L(\d+)(?:-L(\d+))?$")


def text_lines(path):
    """(line number, text) of path's lines outside fenced code blocks."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    fence = None
    for n, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and \
                    line.strip() == m.group(1):
                fence = None
            continue
        if m:
            fence = m.group(1)
            continue
        yield n, line


def heading_text(raw):
    """The text GitHub renders for a heading's markdown."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links, images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text)  # backslash escapes
    text = re.sub(r"\*+", "", text)
    text = re.sub(r"(?<![0-9A-Za-z])_+|_+(?![0-9A-Za-z])", "", text)  # _emphasis_, not snake_case
    return text.strip()


def slug(text):
    """GitHub's anchor of a heading's rendered text, before numbering."""
    out = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch == " ":
            out.append("-")
        elif ch in "-_" or cat[0] in "LMN":
            out.append(ch)
    return "".join(out)


def numbered(slugs):
    seen = {}
    result = []
    for s in slugs:
        if s in seen:
            seen[s] += 1
            candidate = f"{s}-{seen[s]}"
            while candidate in seen:  # "a-1" may be a heading of its own
                seen[s] += 1
                candidate = f"{s}-{seen[s]}"
            seen[candidate] = 0
            result.append(candidate)
        else:
            seen[s] = 0
            result.append(s)
    return result


_anchor_cache = {}


def anchors(path):
    """Every anchor a markdown file offers: its headings' and HTML ones."""
    if path in _anchor_cache:
        return _anchor_cache[path]
    heads, html = [], set()
    prev = None
    for _, line in text_lines(path):
        html.update(HTML_ANCHOR.findall(line))
        m = ATX.match(line)
        if m:
            heads.append(heading_text(m.group(2) or ""))
            prev = None
            continue
        s = SETEXT.match(line)
        if s and prev is not None and prev.strip() and not re.match(r"^ {0,3}[-*_>|]", prev):
            heads.append(heading_text(prev))
            prev = None
            continue
        prev = line
    result = set(numbered([slug(h) for h in heads])) | html
    _anchor_cache[path] = result
    return result


def paragraphs(path):
    """(first line number, text) of each run of non-blank lines outside
    fenced code, its lines joined by newlines: a link's text may span lines."""
    start, buf, last = None, [], None
    for n, line in text_lines(path):
        if line.strip() == "" or (last is not None and n != last + 1):
            if buf:
                yield start, "\n".join(buf)
            start, buf = None, []
        if line.strip() != "":
            if start is None:
                start = n
            buf.append(line)
        last = n
    if buf:
        yield start, "\n".join(buf)


def links(path):
    """(line number, target, why) of every link in a markdown file; why is
    set where the link's markdown is malformed (then no link is made)."""
    for first, para in paragraphs(path):
        plain = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), para)

        def line_of(pos):
            return first + plain.count("\n", 0, pos)

        spans = []
        for m in INLINE_LINK.finditer(plain):
            spans.append(m.span())
            yield line_of(m.start(1)), m.group(1).strip("<>"), None
        for m in re.finditer(r"\]\(", plain):
            if not any(a <= m.start() < b for a, b in spans):
                end = plain.find(")", m.end())
                text = plain[m.end():end if end >= 0 else len(plain)]
                yield line_of(m.start()), text, "not a link: a space in the target, or " \
                    "unbalanced brackets"
        for m in REF_DEF.finditer(plain):
            yield line_of(m.start(1)), m.group(1).strip("<>"), None
        for m in AUTOLINK.finditer(plain):
            yield line_of(m.start(1)), m.group(1), None
        for m in HTML_LINK.finditer(plain):
            yield line_of(m.start(1)), m.group(1), None


def check_external(target):
    if re.search(r"\s", target):
        return "has white space"
    u = urllib.parse.urlsplit(target)
    if u.scheme == "mailto":
        return None if re.match(r"^[^@\s]+@[^@\s]+$", u.path) else "not an address"
    if not u.netloc or not re.match(r"^[A-Za-z0-9.-]+(:\d+)?$", u.netloc.split("@")[-1]):
        return "has no valid host"
    return None


def check_link(root, source, target):
    """Why target, linked from source, is broken; None when it is not."""
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", target)
    if scheme:
        if scheme.group(1).lower() not in ("http", "https", "mailto"):
            return f"scheme {scheme.group(1)}: is neither http(s) nor mailto"
        return check_external(target)
    if target.startswith("//"):
        return "a protocol-relative link: write https://"
    path_part, _, anchor = target.partition("#")
    path_part = urllib.parse.unquote(path_part.split("?")[0])
    if path_part == "":
        dest = source
    elif path_part.startswith("/"):
        dest = os.path.normpath(os.path.join(root, path_part.lstrip("/")))
    else:
        dest = os.path.normpath(os.path.join(os.path.dirname(source), path_part))
    if os.path.relpath(dest, root).startswith(".."):
        return "points outside the repository"
    if not os.path.exists(dest):
        return f"{os.path.relpath(dest, root)} does not exist"
    if not anchor:
        return None
    anchor = urllib.parse.unquote(anchor)
    if os.path.isdir(dest):
        return "an #anchor on a folder"
    if dest.endswith((".md", ".markdown")):
        if anchor not in anchors(dest):
            return f"no heading #{anchor} in {os.path.relpath(dest, root)}"
        return None
    m = LINE_ANCHOR.match(anchor)
    if not m:
        return f"#{anchor}: only #L<line> anchors exist in a file that is not markdown"
    with open(dest, "rb") as f:
        count = f.read().count(b"\n") + 1
    last = int(m.group(2) or m.group(1))
    if not 1 <= int(m.group(1)) <= last <= count:
        return f"#{anchor}: {os.path.relpath(dest, root)} has {count} lines"
    return None


def doc_files(root):
    files = []
    if os.path.isfile(os.path.join(root, "README.md")):
        files.append(os.path.join(root, "README.md"))
    for folder, dirs, names in os.walk(os.path.join(root, "docs")):
        dirs.sort()
        files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".md")]
    return files


def cmd_links(root, given):
    root = os.path.abspath(root)
    files = [os.path.join(root, f) for f in given] if given else doc_files(root)
    broken = checked = 0
    for path in files:
        for n, target, why in links(path):
            checked += 1
            why = why or check_link(root, path, target)
            if why:
                broken += 1
                print(f"{os.path.relpath(path, root)}:{n}: {target}: {why}")
    print(f"{checked} links in {len(files)} files, {broken} broken", file=sys.stderr)
    return 1 if broken else 0


def help_rows(bin_dir, name, markdown):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PSTRAIN_", "PADDLE_", "SLURM_", "POD_"))}
    if markdown:
        env["PSTRAIN_HELP_FORMAT"] = "markdown"
    out = subprocess.run([os.path.join(bin_dir, name), "--help"], env=env, check=True,
                         capture_output=True, text=True).stdout
    rows = []
    if markdown:
        for line in out.splitlines():
            if not line.startswith("| `--"):
                continue
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            flag = cells[0].strip("`").replace("\\|", "|")
            env_name = cells[1].strip("`")
            default = cells[2].strip("`").replace("\\|", "|")
            text = re.sub(r"\\(.)", r"\1", cells[3])
            rows.append((flag, env_name, default, text))
        return rows
    lines = out.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^  (--\S+)(?: (.*))?$", line)
        if not m:
            continue
        flag = m.group(1) + (" " + m.group(2) if m.group(2) else "")
        text = lines[i + 1].strip() if i + 1 < len(lines) else ""
        d = re.match(r"^\s+default: (.*)   env: (\S+)$", lines[i + 2] if i + 2 < len(lines) else "")
        rows.append((flag.rstrip(), d.group(2) if d else "", d.group(1) if d else "", text))
    return rows


def cmd_help_agree(bin_dir):
    bad = 0
    for name in ("trainer", "pserver"):
        plain = help_rows(bin_dir, name, False)
        md = help_rows(bin_dir, name, True)
        if len(plain) < 10 or len(plain) != len(md):
            print(f"{name}: --help lists {len(plain)} flags, its markdown {len(md)}")
            bad += 1
        for a, b in zip(plain, md):
            if a != b:
                print(f"{name}: --help says {a}\n{' ' * len(name)}  markdown says {b}")
                bad += 1
        print(f"{name}: {len(plain)} flags", file=sys.stderr)
    return 1 if bad else 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "links":
        return cmd_links(argv[2], argv[3:])
    if len(argv) >= 2 and argv[1] == "slug":
        for s in numbered([slug(heading_text(t)) for t in argv[2:]]):
            print(s)
        return 0
    if len(argv) == 3 and argv[1] == "help-agree":
        return cmd_help_agree(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
