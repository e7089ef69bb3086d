#!/usr/bin/env bash
# The documentation against the code (label "docs"):
# - docs/flags.md is what scripts/gen-flags-doc makes from the binaries now
#   (trainer and pserver --help in markdown, scripts/launch's parser,
#   gen_ctr --help); a difference is shown with the command that fixes it;
# - the daemons' plain --help and its markdown form list the same flags with
#   the same variable, default and text (one function, one table);
# - every relative link in README.md and docs/**/*.md names a file of the
#   tree and its #anchor a heading there (GitHub's anchor rules); http(s)
#   links are only checked to be well-formed (no network here);
# - each check can fail: a changed flags page, and links broken on purpose in
#   a copy, are caught, and the anchor rules give GitHub's anchors.
source "$(dirname "$0")/lib.sh"
SRC=$(cd "$(dirname "$0")/.." && pwd)
CHECK=(python3 "$SRC/tests/check_docs.py")
for b in trainer pserver gen_ctr; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b is missing (build first)" >&2; exit 1; }
done

# --- docs/flags.md is the binaries' --help -----------------------------------------
fix="scripts/gen-flags-doc --bin $BIN"
"$SRC/scripts/gen-flags-doc" --bin "$BIN" --stdout >"$SCRATCH/flags.md" 2>"$SCRATCH/gen.err" ||
  { echo "FAIL: scripts/gen-flags-doc failed: $(cat "$SCRATCH/gen.err")" >&2; exit 1; }
# same_flags PAGE: whether PAGE is what the binaries print, showing the difference if not.
same_flags() {
  [ -f "$1" ] || { echo "$1 is missing" >&2; return 1; }
  diff -u --label "$1 (the page)" --label "the binaries (scripts/gen-flags-doc)" \
    "$1" "$SCRATCH/flags.md" >&2
}
if same_flags "$SRC/docs/flags.md"; then
  rows=$(grep -c '^| `-' "$SRC/docs/flags.md")
  echo "ok: docs/flags.md is the binaries' --help ($rows flag rows)"
else
  fail "docs/flags.md differs from the binaries' --help (above); fix: $fix"
fi
# The comparison can fail: a page with one default changed is caught.
sed 's/| `32768` |/| `32769` |/' "$SCRATCH/flags.md" >"$SCRATCH/flags-edited.md"
cmp -s "$SCRATCH/flags.md" "$SCRATCH/flags-edited.md" && fail "the edit to the page changed nothing"
same_flags "$SCRATCH/flags-edited.md" 2>/dev/null && fail "an edited flags page passed as generated"
# The page covers every flag of each daemon's table.
for b in trainer pserver; do
  n=$(env -u PSTRAIN_HELP_FORMAT "$BIN/$b" --help | grep -c '^  --')
  m=$(sed -n "/^## $b\$/,/^## /p" "$SCRATCH/flags.md" | grep -c '^| `--')
  [ "$n" -eq "$m" ] || fail "$b --help has $n flags, its section of the page $m"
done

# --- plain --help and markdown --help agree ------------------------------------------
"${CHECK[@]}" help-agree "$BIN" >"$SCRATCH/agree.out" 2>&1 ||
  fail "--help and its markdown form differ: $(cat "$SCRATCH/agree.out")"

# --- links ---------------------------------------------------------------------------
if "${CHECK[@]}" links "$SRC" >"$SCRATCH/links.out" 2>"$SCRATCH/links.err"; then
  echo "ok: links: $(cat "$SCRATCH/links.err")"
else
  cat "$SCRATCH/links.out" >&2
  fail "broken links in README.md or docs/ (above: FILE:LINE: LINK: WHY):" \
    "$(cat "$SCRATCH/links.err")"
fi

# The same check on a copy of the docs with links broken on purpose in a
# page of its own: each is named.
copy="$SCRATCH/copy"
mkdir -p "$copy/common"
cp -r "$SRC/docs" "$copy/"
cp "$SRC/common/options.c" "$copy/common/"
[ -f "$SRC/README.md" ] && cp "$SRC/README.md" "$copy/"
cat >"$copy/docs/planted.md" <<'EOF'
# Planted links

[missing file](no-such-file.md)
[missing anchor](#no-such-heading)
[anchor in another page](../README.md#no-such-heading-either)
[bad url](https://exa mple.com/)
[no host](https:///path)
[other scheme](ftp://example.com/x)
[outside](../../etc/passwd)
[line past the end](../common/options.c#L999999)
![missing image](img/none.png)
[ref]: ./nowhere.md

[fine](flags.md#trainer), [fine too](../common/options.c#L1)
EOF
"${CHECK[@]}" links "$copy" >"$SCRATCH/planted.out" 2>/dev/null &&
  fail "links broken on purpose passed"
for want in 'no-such-file.md' '#no-such-heading:' '#no-such-heading-either' 'exa mple' \
  'https:///path' 'ftp://' '../../etc/passwd' '#L999999' 'img/none.png' './nowhere.md'; do
  grep -qF -- "$want" "$SCRATCH/planted.out" || fail "the planted broken link '$want' was not found"
done
n=$(grep -c '^docs/planted.md:' "$SCRATCH/planted.out")
[ "$n" -eq 10 ] || fail "expected 10 planted broken links, found $n: $(cat "$SCRATCH/planted.out")"

# Good links of every kind pass, and anchors follow GitHub's rules.
fx="$SCRATCH/fixture"
mkdir -p "$fx/docs/sub" "$fx/src"
printf 'int x;\nint y;\n' >"$fx/src/a.c"
cat >"$fx/README.md" <<'EOF'
# Title

See [the guide](docs/guide.md), [its flags](docs/guide.md#the---mode-flag),
[the second Setup](docs/guide.md#setup-1), [a folder](docs/sub/), [code](src/a.c#L2),
[root-relative](/docs/guide.md#über-café-20), <https://example.com/a?b=c#d>,
[mail](mailto:someone@example.com), [here](#title) and [ref][r].

```sh
[not a link](nowhere.md)
```
`[not a link either](nowhere.md)`

[r]: docs/guide.md#snake_case-names
EOF
cat >"$fx/docs/guide.md" <<'EOF'
# Guide
## Setup
## The `--mode` flag
### Setup
Über *café* 2.0!
----------------
## snake_case names
<a name="custom"></a>
[back](../README.md#title), [custom](#custom), [self](guide.md)
EOF
touch "$fx/docs/sub/x.md"
"${CHECK[@]}" links "$fx" >"$SCRATCH/fixture.out" 2>&1 ||
  fail "good links were refused: $(cat "$SCRATCH/fixture.out")"
got=$("${CHECK[@]}" slug 'Setup' 'The `--mode` flag' 'Setup' 'Über *café* 2.0!' \
  'snake_case names' 'Setup' 'setup-1' '**Bold** _it_ [link](x.md) & (parens)' | tr '\n' ' ')
want='setup the---mode-flag setup-1 über-café-20 snake_case-names setup-2 setup-1-1'
want+=' bold-it-link--parens '
[ "$got" = "$want" ] || fail "anchors: got '$got', want '$want'"

[ "$failures" -eq 0 ] || { echo "$failures failure(s)" >&2; exit 1; }
echo "PASS: docs/flags.md matches the binaries; links and anchors resolve"
