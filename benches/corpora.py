"""Make the benchmark corpora from Debian's archive: bash benches/run.sh calls it, or run it alone.

    python3 benches/corpora.py DIR

writes into DIR (nothing is downloaded again when DIR already holds them):
- debian_desc_en.jsonl: every package description of Debian bookworm main, English, from the archive's
  `main/i18n/Translation-en.xz`; one line per distinct description, the short description then the long one
  (paragraph dots as empty lines), id = the archive's Description-md5.
- debian_desc_ja.jsonl: the descriptions translated to Japanese (`Translation-ja.bz2`), with the English ids.
- fortunes_en.jsonl: the cookies of Debian's `fortunes` package (fortune-mod 1.99.1-7.3, BSD), id = the
  fortune file's name and the cookie's position in it; a cookie repeated word for word is kept once.
- SHA256SUMS: the three files' digests (benches/run.sh prints one into each section it writes), and MADE-BY:
  this script's format and the sources' digests. A folder whose files no longer match them is made again; a
  folder holding such files that this script did not make is refused, not overwritten.

Only the Python standard library and deb.debian.org, a package registry. The fortunes package is pinned by
its SHA-256. The Translation files of a stable release change with its point releases (a few descriptions
each): their digests at the time of writing are below, and a different one is said, not refused.
"""

import bz2
import hashlib
import io
import json
import lzma
import os
import sys
import tarfile
import urllib.error
import urllib.request

ARCHIVE = "http://deb.debian.org/debian"
TRANSLATIONS = {
    "en": ("dists/bookworm/main/i18n/Translation-en.xz", lzma.decompress,
           "a3d4a0bfd8e9242810b0885eda7c1a6e05dac15b333ddbaab03ba56f2dfa4bf0"),
    "ja": ("dists/bookworm/main/i18n/Translation-ja.bz2", bz2.decompress,
           "faae0d44702fdb794a53aa689e1334d9b1ecd96f9d042b89bd67fa97a86e7c6c"),
}
FORTUNES = ("pool/main/f/fortune-mod/fortunes_1.99.1-7.3_all.deb",
            "41d0551dc0ff52f875a2ecef7c39da2f672ab468c37e170119f7e0245a9d63c5")
NAMES = ("debian_desc_en.jsonl", "debian_desc_ja.jsonl", "fortunes_en.jsonl")
# Changes when what the corpora hold changes (the parsing, a source), so that a cached folder is made again.
FORMAT = 1


def download(path, expected=None, pinned=False):
    url = f"{ARCHIVE}/{path}"
    print(f"corpora: downloading {url}", file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            body = response.read()
    except (urllib.error.URLError, OSError) as e:
        sys.exit(f"corpora: cannot download {url}: {e}. The corpora come from Debian's archive; where it cannot "
                 "be reached, copy a folder this script made and point BENCH_CORPORA at it")
    digest = hashlib.sha256(body).hexdigest()
    if expected and digest != expected:
        if pinned:
            sys.exit(f"corpora: {url} has SHA-256 {digest}, not the pinned {expected}; the archive changed, "
                     "so the corpus would not be the one the benchmarks describe")
        print(f"corpora: {url} changed since these benchmarks were written (SHA-256 {digest[:12]}, was "
              f"{expected[:12]}): a point release edits a few descriptions, so counts may differ slightly",
              file=sys.stderr)
    return body


def descriptions(text, lang):
    """The archive's Translation file as {id, text} records, the first of each Description-md5 kept."""
    docs, seen = [], set()
    for block in text.split("\n\n"):
        md5, lines, inside = None, [], False
        for line in block.split("\n"):
            if line.startswith("Description-md5: "):
                md5 = line.split(": ", 1)[1]
            elif line.startswith(f"Description-{lang}: "):
                lines, inside = [line.split(": ", 1)[1]], True
            elif inside and line.startswith(" "):
                lines.append("" if line == " ." else line[1:])
            else:
                inside = False
        if md5 and lines and md5 not in seen:
            seen.add(md5)
            docs.append({"id": md5, "text": "\n".join(lines)})
    return docs


def deb_member(deb, prefix):
    """A member of a .deb (an ar archive) by the start of its name."""
    assert deb[:8] == b"!<arch>\n", "not a Debian package"
    at = 8
    while at < len(deb):
        name, size = deb[at:at + 16].decode().strip(), int(deb[at + 48:at + 58])
        if name.startswith(prefix):
            return deb[at + 60:at + 60 + size]
        at += 60 + size + (size % 2)
    raise ValueError(f"no {prefix} in the package")


def fortunes(deb):
    data = tarfile.open(fileobj=io.BytesIO(deb_member(deb, "data.tar")))
    files = sorted((m for m in data.getmembers() if m.isfile() and "/games/fortunes/" in m.name
                    and "." not in os.path.basename(m.name)), key=lambda m: os.path.basename(m.name))
    docs, seen = [], set()
    for member in files:
        name = os.path.basename(member.name)
        text = data.extractfile(member).read().decode("utf-8")
        for n, cookie in enumerate(c.strip("\n") for c in text.split("\n%\n")):
            if cookie.strip() and cookie not in seen:
                seen.add(cookie)
                docs.append({"id": f"{name}:{n}", "text": cookie})
    return docs


def write(folder, name, docs):
    body = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode()
    with open(os.path.join(folder, name + ".part"), "wb") as f:
        f.write(body)
    os.replace(os.path.join(folder, name + ".part"), os.path.join(folder, name))
    print(f"corpora: {name}: {len(docs):,} documents", file=sys.stderr)
    return hashlib.sha256(body).hexdigest()


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def made_here(folder):
    """Whether `folder` holds the corpora this script (this format) made, unchanged since."""
    try:
        made = open(os.path.join(folder, "MADE-BY")).read().split()
        sums = dict(reversed(line.split()) for line in open(os.path.join(folder, "SHA256SUMS")))
    except (OSError, ValueError):
        return False
    return made[:2] == ["corpora.py", f"format-{FORMAT}"] and all(
        os.path.exists(os.path.join(folder, n)) and sums.get(n) == sha256(os.path.join(folder, n)) for n in NAMES)


def main(folder):
    os.makedirs(folder, exist_ok=True)
    if made_here(folder):
        return
    made_by, sums = os.path.join(folder, "MADE-BY"), os.path.join(folder, "SHA256SUMS")
    foreign = [n for n in NAMES if os.path.exists(os.path.join(folder, n))]
    if foreign and not (os.path.exists(made_by) or os.path.exists(sums)):
        sys.exit(f"corpora: {folder} holds {', '.join(foreign)} that this script did not make; "
                 "give it an empty folder (BENCH_CORPORA)")
    for stale in (made_by, sums):
        if os.path.exists(stale):
            os.remove(stale)
    digests, sources = {}, []
    for lang in ("en", "ja"):
        path, decompress, expected = TRANSLATIONS[lang]
        body = download(path, expected)
        sources.append(f"{hashlib.sha256(body).hexdigest()} {path}")
        text = decompress(body).decode("utf-8")
        digests[f"debian_desc_{lang}.jsonl"] = write(folder, f"debian_desc_{lang}.jsonl", descriptions(text, lang))
    deb = download(FORTUNES[0], FORTUNES[1], pinned=True)
    sources.append(f"{FORTUNES[1]} {FORTUNES[0]}")
    digests["fortunes_en.jsonl"] = write(folder, "fortunes_en.jsonl", fortunes(deb))
    with open(sums + ".part", "w") as f:
        f.writelines(f"{digests[n]}  {n}\n" for n in NAMES)
    os.replace(sums + ".part", sums)
    with open(made_by + ".part", "w") as f:
        f.write(f"corpora.py format-{FORMAT}\n" + "".join(f"{s}\n" for s in sources))
    os.replace(made_by + ".part", made_by)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
