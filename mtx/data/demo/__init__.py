"""The built-in demo corpus: English→German pairs generated from a small grammar, offline and deterministic.

It exists so that `mtx prepare recipes/demo.yaml && mtx train recipes/demo.yaml` shows real translation on a
laptop in minutes. The grammar is small (60 nouns, 20 adjectives, 50 verbs, in mtx.data.demo.lexicon) but German
makes a tiny model work for it, the way it makes a big one work on WMT:

- agreement: determiners and adjective endings follow gender, number and case ("ein großer Hund",
  "einen großen Hund", "mit einem großen Hund", "keine großen Hunde"); weak nouns ("den Studenten");
- case: accusative and dative objects, dative verbs ("hilft dem Mann"), two-way prepositions
  ("im Garten" vs "in den Garten"), contractions (im, ins, am, zum, zur);
- word order: V2 after a fronted adverbial ("Heute sieht der Mann …"), verb-final subordinate clauses
  ("…, dass der Mann den Hund gesehen hat"), a clause-first main clause ("Wenn …, liest …"), verb-first
  questions, separable verbs ("ruft den Arzt an"), the verb bracket of perfect and modal tenses;
- negation with "nicht" or "kein";
- numbers written as German compounds with the units before the tens ("dreihunderteinundzwanzig"),
  ordinal dates ("am einundzwanzigsten Juni") and clock times ("um halb acht" = "at half past seven").

Every English sentence has exactly one German translation, so a model can learn it to near-perfect BLEU. The
grammar also knows which English words each German word translates: every pair comes with its gold word
alignment (mtx.data.demo.words), which `mtx prepare` writes beside the valid and test splits.

For domain-adaptation experiments the sentences fall into two domains (`data.source.demo.domain`): "numbers",
those that hold a number, an ordinal date or a clock time (about one in six), and "general", the rest. A domain
keeps the grammar's sentences of that domain in the order it draws them, so "all" is the corpus it always was.
"""

from __future__ import annotations

from mtx.config.data import DemoSource
from mtx.data.demo.grammar import Grammar
from mtx.data.demo.lexicon import MONTHS, number_en, ordinal_en
from mtx.data.demo.words import AlignedPair
from mtx.errors import MtxError

MAX_WORDS = 20  # longer sentences are drawn again: the demo must train in minutes

# The English words only a number, a date or a clock time uses: the numbers and ordinals the grammar spells
# (those above 99 are made of these and "hundred", "thousand"), the months, "o'clock".
NUMBER_WORDS = frozenset(
    {word for n in range(1, 100) for word in (*number_en(n).split(), *ordinal_en(n).split())}
    | {"hundred", "thousand", "o'clock"} | {month.lower() for month, _, _ in MONTHS}
)


def in_domain(english: str, domain: str) -> bool:
    """Whether the English sentence belongs to the demo domain `domain` (all, numbers or general)."""
    if domain == "all":
        return True
    has_number = any(word.strip(",.?").lower() in NUMBER_WORDS for word in english.split())
    return has_number == (domain == "numbers")


def sample_pairs(count: int, seed: int, exclude: set[str] = frozenset(), domain: str = "all",
                 key: str = "data.source.demo") -> list[AlignedPair]:
    """`count` distinct pairs of the domain `domain` whose English is not in `exclude`, with their gold
    alignments; each English sentence maps to one German. `key`: the recipe's, which an error names."""
    grammar = Grammar(seed)
    seen: set[str] = set(exclude)
    pairs = []
    attempts = 0
    while len(pairs) < count:
        attempts += 1
        if attempts > 20 * count + 1000:
            raise MtxError(f"{key}: the demo grammar could not draw {count:,} distinct sentences "
                           f"of the domain {domain!r}; ask for fewer pairs.")
        pair = grammar.sentence()
        if (pair.en in seen or len(pair.en.split()) > MAX_WORDS or len(pair.de.split()) > MAX_WORDS
                or not in_domain(pair.en, domain)):
            continue
        seen.add(pair.en)
        pairs.append(pair)
    return pairs


def demo_splits(config: DemoSource, key: str = "data.source.demo") -> dict[str, list[AlignedPair]]:
    """Train, valid and test of the configured domain, with no English sentence in more than one of them, and
    their gold alignments. `key`: the configuration's in the recipe, which an error names."""
    held_out = sample_pairs(config.valid + config.test, config.seed + 1_000_003, domain=config.domain, key=key)
    valid, test = held_out[: config.valid], held_out[config.valid :]
    train = sample_pairs(config.pairs, config.seed, exclude={pair.en for pair in held_out}, domain=config.domain,
                         key=key)
    return {"train": train, "valid": valid, "test": test}
