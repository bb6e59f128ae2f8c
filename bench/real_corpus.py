"""A parallel corpus of real human translations, English→German and English→French, from Debian's message catalogs.

Why: the demo grammar that mtx's tests and demos train on is synthetic, so it cannot answer tokenization
questions (BPE or unigram, joint or separate vocabularies, which size) that depend on real orthography: German
compounds, umlauts and ß, French accents, elisions and punctuation. This script builds such a corpus offline from
what this project's machines can reach: the translated gettext catalogs (.mo files) inside Debian bookworm
packages, written by the projects' translators. Each catalog maps an English msgid to its translation; the script
cleans the pairs (accelerators, markup, multi-line entries, format-heavy strings), keeps one translation per
English sentence, holds out valid and test sets chosen by a hash of the English side, and records each package's
version, .deb checksum and licence next to the output. The same cache gives byte-identical output.

    .venv/bin/python bench/real_corpus.py [--out runs/real_corpus] [--cache runs/real_corpus/debs]

Downloads use `apt-get download` (run `apt-get update` first on a new machine); .debs already in the cache are
used as they are, so a rerun needs no network. Progress goes to stderr; one JSON line per language pair to stdout.
"""

from __future__ import annotations

import argparse
import codecs
import hashlib
import html
import io
import json
import re
import statistics
import struct
import subprocess
import sys
import tarfile
import time
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

LANGUAGES = ("de", "fr")


@dataclass(frozen=True)
class Package:
    """A Debian bookworm binary package and why it is in the list."""

    name: str
    why: str
    copyright_from: str | None = None  # the package whose doc folder holds the copyright file, if not this one


PACKAGES: tuple[Package, ...] = (
    # Toolchain and system: long diagnostics and --help texts.
    Package("gcc-12-locales", "GCC 12 and cpp diagnostics (gcc.mo, cpplib.mo): 15k entries", "gcc-12-base"),
    Package("binutils-common", "as, ld, objdump... messages; the French catalogs are far more complete"),
    Package("libc-l10n", "glibc's messages"),
    Package("coreutils", "coreutils' --help texts and errors"),
    Package("util-linux-locales", "util-linux's --help texts and messages"),
    Package("e2fsprogs-l10n", "e2fsprogs' messages"),
    Package("tar", "GNU tar"),
    Package("wget", "GNU wget"),
    Package("gettext", "gettext's tools"),
    Package("texinfo", "makeinfo and info"),
    Package("grub-common", "GRUB's tools and menus"),
    Package("dpkg", "dpkg's messages"),
    Package("apt", "apt's messages"),
    Package("aptitude-common", "aptitude's interface"),
    Package("gnupg-l10n", "GnuPG's messages and help"),
    Package("git", "git's messages (5k entries)"),
    Package("vim-runtime", "Vim's messages"),
    Package("postgresql-15", "PostgreSQL server messages (postgres, pg_* tools): 7k entries"),
    Package("postgresql-client-15", "psql, pg_dump and the other client tools"),
    # Communication.
    Package("mutt", "mutt mail client"),
    Package("neomutt", "neomutt mail client"),
    Package("claws-mail-i18n", "Claws Mail"),
    Package("pidgin-data", "Pidgin and libpurple"),
    Package("hexchat-common", "HexChat IRC client"),
    Package("weechat-core", "WeeChat: long command help texts"),
    Package("gajim", "Gajim XMPP client"),
    Package("filezilla-common", "FileZilla"),
    Package("mc-data", "Midnight Commander"),
    # Office and applications.
    Package("libreoffice-l10n-de", "LibreOffice 7.4 UI, German (msgctxt is a key, msgid the English text): 28k"),
    Package("libreoffice-l10n-fr", "LibreOffice 7.4 UI, French: 28k entries"),
    Package("gnucash-common", "GnuCash"),
    Package("gramps", "Gramps genealogy"),
    Package("lyx-common", "LyX"),
    Package("gnumeric-common", "Gnumeric, with spreadsheet function descriptions"),
    Package("calibre", "calibre e-book manager (catalogs in localization/locales.zip)"),
    Package("libsane-common", "SANE scanner backends: option descriptions"),
    # GNOME.
    Package("libgtk-3-common", "GTK 3"),
    Package("libgtk-4-common", "GTK 4"),
    Package("libglib2.0-data", "GLib"),
    Package("evolution-common", "Evolution"),
    Package("evolution-data-server-common", "Evolution Data Server"),
    Package("gnome-control-center-data", "GNOME Settings"),
    Package("nautilus-data", "GNOME Files"),
    Package("gnome-shell-common", "GNOME Shell"),
    Package("gnome-software-common", "GNOME Software"),
    Package("gnome-builder", "GNOME Builder"),
    Package("epiphany-browser-data", "GNOME Web"),
    Package("geary", "Geary mail client"),
    Package("rhythmbox-data", "Rhythmbox"),
    # Graphics and media.
    Package("inkscape", "Inkscape: 10k entries"),
    Package("gimp-data", "GIMP with its plug-ins and script-fu: 9k entries"),
    Package("darktable", "darktable"),
    Package("audacity-data", "Audacity"),
    Package("kdenlive-data", "Kdenlive"),
    Package("digikam-data", "digiKam: 9k entries"),
    Package("krita-l10n", "Krita"),
    # KDE.
    Package("plasma-workspace-data", "KDE Plasma workspace"),
    Package("kio", "KDE Frameworks KIO"),
    Package("ktexteditor-data", "KDE Frameworks KTextEditor"),
    Package("kmail", "KMail"),
    Package("korganizer", "KOrganizer"),
    Package("kdepim-runtime", "KDE PIM runtime (Akonadi resources)"),
    Package("okular", "Okular"),
    Package("konsole", "Konsole"),
    Package("dolphin", "Dolphin"),
    Package("krusader", "Krusader"),
    Package("konversation-data", "Konversation"),
    Package("ktorrent-data", "KTorrent"),
    Package("kmymoney-common", "KMyMoney"),
    Package("skrooge-common", "Skrooge"),
    Package("labplot-data", "LabPlot"),
    Package("rkward-data", "RKWard"),
    Package("calligra-data", "Calligra suite"),
    Package("kexi-data", "Kexi"),
    Package("tellico-data", "Tellico"),
    Package("cantor", "Cantor"),
    # Games: narrative prose, the longest sentences of the corpus.
    Package("freeciv-data", "Freeciv: rules, help texts and nation histories"),
    Package("wesnoth-1.16-did", "Wesnoth campaign Descent into Darkness: story dialogue"),
    Package("wesnoth-1.16-dm", "Wesnoth campaign Delfador's Memoirs"),
    Package("wesnoth-1.16-dw", "Wesnoth campaign Dead Water"),
    Package("wesnoth-1.16-ei", "Wesnoth campaign The Eastern Invasion"),
    Package("wesnoth-1.16-httt", "Wesnoth campaign Heir to the Throne"),
    Package("wesnoth-1.16-l", "Wesnoth campaign Liberty"),
    Package("wesnoth-1.16-low", "Wesnoth campaign Legend of Wesmere"),
    Package("wesnoth-1.16-nr", "Wesnoth campaign Northern Rebirth"),
    Package("wesnoth-1.16-sof", "Wesnoth campaign The Sceptre of Fire"),
    Package("wesnoth-1.16-sota", "Wesnoth campaign Secrets of the Ancients"),
    Package("wesnoth-1.16-sotbe", "Wesnoth campaign Son of the Black-Eye"),
    Package("wesnoth-1.16-thot", "Wesnoth campaign The Hammer of Thursagan"),
    Package("wesnoth-1.16-trow", "Wesnoth campaign The Rise of Wesnoth"),
    Package("wesnoth-1.16-tsg", "Wesnoth campaign The South Guard"),
    Package("wesnoth-1.16-ttb", "Wesnoth campaign A Tale of Two Brothers"),
    Package("wesnoth-1.16-utbs", "Wesnoth campaign Under the Burning Suns"),
)

# Cleaning thresholds.
MIN_SOURCE_WORDS = 2  # letter words (2+ letters) on the English side
MAX_NON_LETTER = 0.25  # share of non-space characters that are not letters, on either side
MAX_PLACEHOLDERS = 2  # printf, Qt (%1), Python ({0}) and shell (${x}) placeholders in the English side
MAX_WORDS = 250
MAX_WORD_RATIO = 3.0
HELD_OUT_MIN_WORDS = 4  # valid and test prefer English sentences of at least this many words

CATALOG = re.compile(r"(?:^|/)(de|fr)/LC_MESSAGES/[^/]+\.mo$")
ZIPPED_CATALOG = re.compile(r"^(de|fr)/[^/]+\.mo$")
CALIBRE_ZIP = "/localization/locales.zip"
CREDIT_CONTEXTS = frozenset({"NAME OF TRANSLATORS", "EMAIL OF TRANSLATORS"})
CREDIT_IDS = frozenset({"Your names", "Your emails", "translator-credits", "translator_credits"})
# Context inside the msgid: Wesnoth's "race^Elves", GLib Q_()'s "Stock label|_Open", Freeciv's "?plural:Hittites".
ID_CONTEXT = re.compile(r"(?:[A-Za-z][\w ]*[\^|]|\?[\w ]+:)(?=\S)")
BLOCK_TAG = re.compile(r"</?(?:p|br|li|ul|ol|div|h\d|table|tr|td|th|hr|nl|para|title|subtitle|list|item)\b[^<>]*>",
                       re.IGNORECASE)
INLINE_TAG = re.compile(r"</?[A-Za-z][\w:.-]*(?:\s[^<>]*)?/?>")
ENTITY = re.compile(r"&(?:[A-Za-z]\w*|#\d+|#x[0-9a-fA-F]+);")
GCC_QUOTES = (("%<", "‘"), ("%>", "’"))  # GCC's quoting directives, shown to the user as these quotes
SENTENCE_END = (".", "!", "?", ":", ";")
PUNCTUATION = ".,:;!?()[]'\"«»“”„‘’"
ACCELERATOR = re.compile(r"[_&~](?=[^\W_])")
LETTER_WORD = re.compile(r"[^\W\d_]{2,}")
CONTROL = re.compile(r"[\x00-\x1f\x7f\ufffd]")
PLACEHOLDER = re.compile(r"%(?:\d+\$)?[-+ #0']*\d*(?:\.\d+)?(?:hh?|ll?|[Lzjtq])?[a-zA-Z%<>]|%\d+|\{\d*\}|\$\{?\w+\}?")
CODE = re.compile(r"@[A-Za-z]|://")  # texinfo commands, e2fsck's @-abbreviations, e-mail addresses, URLs
NON_WORD = re.compile(r"[\W_]+")
LICENSE_FIELD = re.compile(r"^License:[ \t]*(\S[^\n]*)$", re.MULTILINE)
COMMON_LICENSE = re.compile(r"/usr/share/common-licenses/([A-Za-z0-9][\w.+-]*[\w+])")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- Downloading -------------------------------------------------------------------------------------------------


def package_names() -> list[str]:
    """Every package to download: the list's, and those that only lend their copyright file."""
    names = [package.name for package in PACKAGES]
    names += [package.copyright_from for package in PACKAGES if package.copyright_from]
    return sorted(set(names))


def cached_deb(cache: Path, name: str) -> Path | None:
    """The cached .deb of a package; more than one version in the cache is an error (which one is meant?)."""
    found = sorted(cache.glob(f"{name}_*.deb"))
    if len(found) > 1:
        raise SystemExit(f"several versions of {name} in {cache}: {[p.name for p in found]}; remove the stale ones")
    return found[0] if found else None


def download(cache: Path, names: list[str]) -> tuple[dict[str, Path], float]:
    """The .deb of each package, fetched with `apt-get download` unless cached; and the seconds spent fetching."""
    cache.mkdir(parents=True, exist_ok=True)
    missing = [name for name in names if cached_deb(cache, name) is None]
    started = time.perf_counter()
    if missing:
        log(f"downloading {len(missing)} packages into {cache}")
        result = subprocess.run(["apt-get", "download", *missing], cwd=cache, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"apt-get download failed (run `apt-get update` first?):\n{result.stderr}")
    seconds = time.perf_counter() - started if missing else 0.0
    debs = {}
    for name in names:
        path = cached_deb(cache, name)
        if path is None:
            raise SystemExit(f"{name}: no .deb in {cache} after apt-get download")
        debs[name] = path
    return debs, seconds


# --- Reading a .deb ----------------------------------------------------------------------------------------------


def ar_members(data: bytes) -> dict[str, bytes]:
    """The members of an ar archive (a .deb is one: debian-binary, control.tar.*, data.tar.*)."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive")
    members, position = {}, 8
    while position + 60 <= len(data):
        header = data[position : position + 60]
        name = header[:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii"))
        members[name] = data[position + 60 : position + 60 + size]
        position += 60 + size + size % 2
    return members


def open_tar(members: dict[str, bytes], stem: str) -> tarfile.TarFile:
    """The member `stem`.tar(.xz|.gz|.bz2) as an open tar archive."""
    for name, payload in sorted(members.items()):
        if name.startswith(stem + ".tar"):
            if name.endswith(".zst"):
                raise SystemExit(f"{name}: zstd-compressed .debs are not supported by the standard library")
            return tarfile.open(fileobj=io.BytesIO(payload), mode="r:*")
    raise ValueError(f"no {stem}.tar member")


@dataclass
class Deb:
    """What the corpus needs from one .deb."""

    name: str
    version: str
    sha256: str
    catalogs: list[tuple[str, str, bytes]] = field(default_factory=list)  # (language, path, .mo bytes), sorted
    copyright: str | None = None


def control_field(control: str, key: str) -> str:
    match = re.search(rf"^{key}:[ \t]*(\S+)", control, re.MULTILINE)
    if not match:
        raise ValueError(f"control file without {key}")
    return match.group(1)


def zipped_catalogs(payload: bytes, path: str) -> Iterator[tuple[str, str, bytes]]:
    """calibre keeps its catalogs in a zip: locales.zip/de/messages.mo."""
    with zipfile.ZipFile(io.BytesIO(payload)) as archive:
        for name in sorted(archive.namelist()):
            match = ZIPPED_CATALOG.match(name)
            if match:
                yield match.group(1), f"{path}/{name}", archive.read(name)


def read_deb(path: Path) -> Deb:
    """The version, checksum, German and French catalogs and copyright file of one .deb."""
    data = path.read_bytes()
    members = ar_members(data)
    with open_tar(members, "control") as control_tar:
        control_file = control_tar.extractfile("./control")
        control = control_file.read().decode("utf-8") if control_file else ""
    deb = Deb(control_field(control, "Package"), control_field(control, "Version"), hashlib.sha256(data).hexdigest())
    copyright_path = f"usr/share/doc/{deb.name}/copyright"
    with open_tar(members, "data") as data_tar:
        for member in data_tar:
            if not member.isfile():
                continue
            name = member.name.removeprefix("./")
            match = CATALOG.search(name)
            if match or name.endswith(CALIBRE_ZIP) or name == copyright_path:
                payload = data_tar.extractfile(member).read()
                if match:
                    deb.catalogs.append((match.group(1), name, payload))
                elif name == copyright_path:
                    deb.copyright = payload.decode("utf-8", errors="replace")
                else:
                    deb.catalogs.extend(zipped_catalogs(payload, name))
    deb.catalogs.sort(key=lambda catalog: catalog[:2])
    return deb


# --- Licences ----------------------------------------------------------------------------------------------------


def licences(copyright_text: str | None) -> tuple[str, list[str]]:
    """The main licence (that of `Files: *` in a machine-readable file, else the first common-licenses file named)
    and every licence the copyright file names."""
    if not copyright_text:
        return "unknown", []
    named = [value.strip() for value in LICENSE_FIELD.findall(copyright_text)]
    named += [value.rstrip(".") for value in COMMON_LICENSE.findall(copyright_text)]
    main = "unknown"
    for paragraph in re.split(r"\n\s*\n", copyright_text):
        field_match = LICENSE_FIELD.search(paragraph)
        if field_match and re.search(r"^Files:\s*\*\s*$", paragraph, re.MULTILINE):
            main = field_match.group(1).strip()
            break
    else:
        common = COMMON_LICENSE.findall(copyright_text)
        if common:
            main = common[0].rstrip(".")
        elif named:
            main = named[0]
    return main, sorted(set(named))


# --- Reading a .mo catalog ---------------------------------------------------------------------------------------


def mo_entries(data: bytes) -> list[tuple[bytes, bytes]]:
    """The raw (msgid, msgstr) byte strings of a GNU .mo file, in file order, header included."""
    for order in "<>":
        magic, _revision, count, ids_at, strings_at = struct.unpack_from(order + "5I", data)
        if magic == 0x950412DE:
            break
    else:
        raise ValueError("not a .mo file")
    entries = []
    for index in range(count):
        id_length, id_at = struct.unpack_from(order + "2I", data, ids_at + 8 * index)
        string_length, string_at = struct.unpack_from(order + "2I", data, strings_at + 8 * index)
        entries.append((data[id_at : id_at + id_length], data[string_at : string_at + string_length]))
    return entries


def catalog_charset(entries: list[tuple[bytes, bytes]]) -> str:
    """The charset the header declares; UTF-8 when it names none or one Python does not know."""
    for msgid, msgstr in entries:
        if msgid == b"":
            match = re.search(rb"charset=([\w.:-]+)", msgstr)
            if match:
                try:
                    return codecs.lookup(match.group(1).decode("ascii")).name
                except LookupError:
                    break
    return "utf-8"


def catalog_pairs(data: bytes) -> Iterator[tuple[str, str]]:
    """(English, translation) of a catalog: singular forms, msgctxt and id-prefix contexts stripped, header and
    translator credits left out; undecodable entries skipped."""
    entries = mo_entries(data)
    charset = catalog_charset(entries)
    for raw_id, raw_string in entries:
        try:
            msgid, msgstr = raw_id.decode(charset), raw_string.decode(charset)
        except UnicodeDecodeError:
            continue
        context, _, msgid = msgid.rpartition("\x04")
        msgid, msgstr = msgid.split("\x00")[0], msgstr.split("\x00")[0]
        if not msgid or not msgstr or context in CREDIT_CONTEXTS or msgid in CREDIT_IDS:
            continue
        prefix = ID_CONTEXT.match(msgid)
        if prefix and (prefix.group()[0] == "?" or prefix.group()[-1] not in msgstr):
            msgid = msgid[prefix.end() :]
        yield msgid, msgstr


# --- Cleaning ----------------------------------------------------------------------------------------------------


def strip_markup(text: str) -> str:
    """Block tags become line breaks, other tags vanish, HTML entities are decoded, GCC's %< %> become quotes."""
    text = INLINE_TAG.sub("", BLOCK_TAG.sub("\n", text))
    for directive, quote in GCC_QUOTES:
        text = text.replace(directive, quote)
    return ENTITY.sub(lambda match: html.unescape(match.group()), text)


def strip_accelerators(text: str, other: str) -> str:
    """Drops keyboard-accelerator marks (_File, &File, ~File) and collapses whitespace. A token found unchanged on
    the other side (an identifier such as max_connections or __fentry__) keeps its marks."""
    shared = {token.strip(PUNCTUATION) for token in other.split()}
    tokens = text.split()
    return " ".join(token if token.strip(PUNCTUATION) in shared else ACCELERATOR.sub("", token) for token in tokens)


def non_letter_share(text: str) -> float:
    characters = text.replace(" ", "")
    return sum(not character.isalpha() for character in characters) / max(len(characters), 1)


def keep_line(source: str, target: str) -> bool:
    """Whether a cleaned line pair is a sentence pair worth keeping."""
    if not source or not target or source == target or source.startswith("-"):
        return False
    if CONTROL.search(source) or CONTROL.search(target) or CODE.search(source) or CODE.search(target):
        return False
    if len(PLACEHOLDER.findall(source)) > MAX_PLACEHOLDERS:
        return False
    if len(LETTER_WORD.findall(source)) < MIN_SOURCE_WORDS or not LETTER_WORD.search(target):
        return False
    if max(non_letter_share(source), non_letter_share(target)) > MAX_NON_LETTER:
        return False
    source_words, target_words = len(source.split()), len(target.split())
    if max(source_words, target_words) > MAX_WORDS:
        return False
    return max(source_words, target_words) / min(source_words, target_words) <= MAX_WORD_RATIO


def unwrap(text: str) -> list[str]:
    """The non-empty lines of a text, each joined to the previous one when that one ends without . ! ? : ; (a
    wrapped sentence: --help texts wrap at different words in each language)."""
    lines: list[str] = []
    for line in text.split("\n"):
        line = line.strip()
        if line and lines and not lines[-1].endswith(SENTENCE_END):
            lines[-1] += " " + line
        elif line:
            lines.append(line)
    return lines


def clean_entry(msgid: str, msgstr: str) -> list[tuple[str, str]]:
    """The kept line pairs of one catalog entry: a multi-line entry is split into (unwrapped) lines only when both
    sides have the same number of them, otherwise it is dropped."""
    source_lines, target_lines = unwrap(strip_markup(msgid)), unwrap(strip_markup(msgstr))
    if len(source_lines) != len(target_lines):
        return []
    pairs = []
    for source, target in zip(source_lines, target_lines, strict=True):
        source, target = strip_accelerators(source, target), strip_accelerators(target, source)
        if keep_line(source, target):
            pairs.append((source, target))
    return pairs


# --- Building the corpus -----------------------------------------------------------------------------------------


@dataclass
class Collected:
    """Every cleaned pair of one language pair, with how often it occurs and the first package that has it."""

    counts: Counter = field(default_factory=Counter)
    first_package: dict[tuple[str, str], str] = field(default_factory=dict)

    def add(self, pairs: Iterable[tuple[str, str]], package: str) -> int:
        added = 0
        for pair in pairs:
            self.counts[pair] += 1
            self.first_package.setdefault(pair, package)
            added += 1
        return added


def collect(debs: list[Deb]) -> tuple[dict[str, Collected], dict[str, dict[str, int]]]:
    """The cleaned pairs per language, and each package's number of cleaned lines per language."""
    collected = {language: Collected() for language in LANGUAGES}
    lines: dict[str, dict[str, int]] = {}
    for deb in debs:
        lines[deb.name] = dict.fromkeys(LANGUAGES, 0)
        for language, _path, data in deb.catalogs:
            pairs = [pair for msgid, msgstr in catalog_pairs(data) for pair in clean_entry(msgid, msgstr)]
            lines[deb.name][language] += collected[language].add(pairs, deb.name)
        log(f"  {deb.name} {deb.version}: {len(deb.catalogs)} catalogs, cleaned lines {lines[deb.name]}")
    return collected, lines


def one_target_each(collected: Collected) -> dict[str, str]:
    """One translation per English sentence: the most frequent, then the lexicographically first."""
    best: dict[str, tuple[int, str]] = {}
    for (source, target), count in collected.counts.items():
        candidate = (-count, target)
        if source not in best or candidate < best[source]:
            best[source] = candidate
    return {source: target for source, (_count, target) in best.items()}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def split_key(source: str) -> str:
    """Sentences that differ only in case, punctuation or spacing share a key and so a split."""
    return NON_WORD.sub(" ", source.lower()).strip()


def split(pairs: dict[str, str], valid: int, test: int) -> dict[str, list[tuple[str, str]]]:
    """valid and test: one pair for each of the first keys in hash order, sentences of HELD_OUT_MIN_WORDS words
    first; train: the pairs of every other key (the held-out keys' other variants are dropped), in hash order."""
    by_key: dict[str, list[str]] = {}
    for source in sorted(pairs):
        by_key.setdefault(split_key(source), []).append(source)
    order = sorted(by_key, key=lambda key: (len(key.split()) < HELD_OUT_MIN_WORDS, digest(key)))
    held_out = order[: valid + test]
    splits = {
        "valid": [(by_key[key][0], pairs[by_key[key][0]]) for key in held_out[:valid]],
        "test": [(by_key[key][0], pairs[by_key[key][0]]) for key in held_out[valid:]],
    }
    train_sources = [source for key in order[valid + test :] for source in by_key[key]]
    splits["train"] = [(source, pairs[source]) for source in sorted(train_sources, key=digest)]
    return splits


def write_lines(path: Path, lines: list[str]) -> str:
    """Writes one line per item and returns the file's sha256."""
    payload = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(payload)
    return hashlib.sha256(payload).hexdigest()


def write_language(out: Path, language: str, splits: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    """OUT/en-LANG/{train,valid,test}.{en,LANG}; returns the sha256 of each file by its path under OUT."""
    folder = out / f"en-{language}"
    folder.mkdir(parents=True, exist_ok=True)
    checksums = {}
    for name in ("train", "valid", "test"):
        for side, index in (("en", 0), (language, 1)):
            path = folder / f"{name}.{side}"
            checksums[str(path.relative_to(out))] = write_lines(path, [pair[index] for pair in splits[name]])
    return checksums


def contributions(splits: dict[str, list[tuple[str, str]]], collected: Collected) -> Counter:
    """Pairs in the output per package, each pair credited to the first package in PACKAGES that has it."""
    return Counter(collected.first_package[pair] for pairs in splits.values() for pair in pairs)


def median_words(pairs: list[tuple[str, str]], index: int) -> float:
    return float(statistics.median(len(pair[index].split()) for pair in pairs)) if pairs else 0.0


# --- Reports -----------------------------------------------------------------------------------------------------


def source_records(debs: dict[str, Deb], credit: dict[str, Counter], lines: dict[str, dict[str, int]]) -> list[dict]:
    """One record per package of PACKAGES for sources.json."""
    records = []
    for package in PACKAGES:
        deb = debs[package.name]
        copyright_deb = debs[package.copyright_from] if package.copyright_from else deb
        main, every = licences(copyright_deb.copyright)
        records.append({
            "package": deb.name,
            "version": deb.version,
            "deb_sha256": deb.sha256,
            "why": package.why,
            "licence": main,
            "licences": every,
            "copyright_file": f"usr/share/doc/{copyright_deb.name}/copyright",
            "catalogs": {language: sum(c[0] == language for c in deb.catalogs) for language in LANGUAGES},
            "cleaned_lines": lines[deb.name],
            "pairs": {f"en-{language}": credit[language][deb.name] for language in LANGUAGES},
        })
    return records


def sources_markdown(records: list[dict], counts: dict[str, dict[str, int]], checksums: dict[str, str]) -> str:
    """SOURCES.md: the packages, their licences and contributions, the counts and the output checksums."""
    lines = [
        "# Sources of the real-data corpus",
        "",
        "Built by `bench/real_corpus.py` from the German and French gettext catalogs (.mo) of these Debian bookworm",
        "packages. `pairs` counts the output pairs (train, valid and test) credited to the package: a pair found in",
        "several packages is credited to the first one listed. `licence` is that of the `Files: *` paragraph of the",
        "package's copyright file (or the first licence it names); sources.json lists every licence named there.",
        "",
        "| package | version | licence | pairs en-de | pairs en-fr | deb sha256 |",
        "|---|---|---|---|---|---|",
    ]
    for record in records:
        parts = record["licence"].split(" and ")
        licence = " and ".join(parts[:3]) + (" and ..." if len(parts) > 3 else "")
        extra = len(record["licences"]) - (record["licence"] in record["licences"])
        licence += f" (+{extra} more)" if extra > 0 else ""
        lines.append(f"| {record['package']} | {record['version']} | {licence} | {record['pairs']['en-de']} | "
                     f"{record['pairs']['en-fr']} | `{record['deb_sha256'][:16]}` |")
    lines += ["", "| language pair | train | valid | test |", "|---|---|---|---|"]
    for pair, split_counts in counts.items():
        lines.append(f"| {pair} | {split_counts['train']} | {split_counts['valid']} | {split_counts['test']} |")
    lines += ["", "| file | sha256 |", "|---|---|"]
    lines += [f"| {path} | `{checksum}` |" for path, checksum in sorted(checksums.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/real_corpus"), help="output folder")
    parser.add_argument("--cache", type=Path, help="folder of downloaded .debs (default: OUT/debs)")
    parser.add_argument("--valid", type=int, default=2000, help="valid pairs per language pair")
    parser.add_argument("--test", type=int, default=2000, help="test pairs per language pair")
    args = parser.parse_args(argv)
    cache = args.cache or args.out / "debs"

    paths, download_seconds = download(cache, package_names())
    started = time.perf_counter()
    log(f"reading {len(paths)} packages")
    with ProcessPoolExecutor() as pool:
        debs = dict(zip(paths, pool.map(read_deb, paths.values()), strict=True))
    collected, lines = collect([debs[package.name] for package in PACKAGES])
    read_seconds = time.perf_counter() - started

    checksums: dict[str, str] = {}
    credit: dict[str, Counter] = {}
    counts: dict[str, dict[str, int]] = {}
    for language in LANGUAGES:
        language_started = time.perf_counter()
        splits = split(one_target_each(collected[language]), args.valid, args.test)
        checksums.update(write_language(args.out, language, splits))
        credit[language] = contributions(splits, collected[language])
        counts[f"en-{language}"] = {name: len(pairs) for name, pairs in splits.items()}
        print(json.dumps({
            "pair": f"en-{language}",
            **counts[f"en-{language}"],
            "median_words_en": median_words(splits["train"], 0),
            f"median_words_{language}": median_words(splits["train"], 1),
            "packages": len(PACKAGES),
            "download_seconds": round(download_seconds, 1),
            "read_seconds": round(read_seconds, 1),
            "seconds": round(time.perf_counter() - language_started, 1),
        }), flush=True)

    records = source_records(debs, credit, lines)
    (args.out / "sources.json").write_text(
        json.dumps({"packages": records, "counts": counts, "files": dict(sorted(checksums.items()))},
                   indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (args.out / "SOURCES.md").write_text(sources_markdown(records, counts, checksums), encoding="utf-8")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
