"""The demo corpus's words: English and German lexicon, German inflection, numbers, dates and noun phrases.

Everything here is a table or a pure function of one, so each agreement rule can be checked on its own
(tests/unit/test_demo.py); mtx.data.demo.grammar combines them into sentences.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtx.data.demo.words import Phrase, Word, english_words, translating

# ------------------------------------------------------------------------------------------------ lexicon

CASES = ("nom", "acc", "dat")
GENDERS = ("m", "f", "n")  # with "pl" as the fourth column of every table below


@dataclass(frozen=True)
class Noun:
    en: str
    en_pl: str
    de: str
    de_pl: str
    gender: str
    kinds: frozenset[str]
    de_oblique: str | None = None  # weak nouns: "den Studenten", "dem Jungen"

    def de_form(self, plural: bool, case: str) -> str:
        if plural:
            return self.de_pl + "n" if case == "dat" and self.de_pl[-1] not in "ns" else self.de_pl
        return self.de_oblique if self.de_oblique and case != "nom" else self.de


def _nouns(table: str) -> list[Noun]:
    """One noun a line: en en_pl de de_pl gender kinds [oblique]."""
    nouns = []
    for line in table.strip().splitlines():
        en, en_pl, de, de_pl, gender, kinds, *oblique = line.split()
        nouns.append(Noun(en, en_pl, de, de_pl, gender, frozenset(kinds.split(",")), *oblique))
    return nouns


NOUNS = _nouns("""
man men Mann Männer m person
woman women Frau Frauen f person
child children Kind Kinder n person
teacher teachers Lehrer Lehrer m person
doctor doctors Arzt Ärzte m person
friend friends Freund Freunde m person
sister sisters Schwester Schwestern f person
brother brothers Bruder Brüder m person
student students Student Studenten m person Studenten
boy boys Junge Jungen m person Jungen
girl girls Mädchen Mädchen n person
neighbor neighbors Nachbar Nachbarn m person Nachbarn
baker bakers Bäcker Bäcker m person
grandmother grandmothers Großmutter Großmütter f person
farmer farmers Bauer Bauern m person Bauern
dog dogs Hund Hunde m animal
cat cats Katze Katzen f animal
horse horses Pferd Pferde n animal
bird birds Vogel Vögel m animal
mouse mice Maus Mäuse f animal
cow cows Kuh Kühe f animal
duck ducks Ente Enten f animal
book books Buch Bücher n thing,readable
letter letters Brief Briefe m thing,readable,openable
newspaper newspapers Zeitung Zeitungen f thing,readable
table tables Tisch Tische m thing,furniture,buildable
chair chairs Stuhl Stühle m thing,furniture,buildable
bed beds Bett Betten n thing,furniture,buildable
car cars Auto Autos n thing,vehicle
bicycle bicycles Fahrrad Fahrräder n thing,vehicle
door doors Tür Türen f thing,openable
window windows Fenster Fenster n thing,openable
box boxes Kiste Kisten f thing,openable,buildable
bag bags Tasche Taschen f thing,openable
key keys Schlüssel Schlüssel m thing
ball balls Ball Bälle m thing
picture pictures Bild Bilder n thing,paintable
cup cups Tasse Tassen f thing
umbrella umbrellas Schirm Schirme m thing
apple apples Apfel Äpfel m food
pear pears Birne Birnen f food
cake cakes Kuchen Kuchen m food,cookable
soup soups Suppe Suppen f food,cookable
egg eggs Ei Eier n food,cookable
banana bananas Banane Bananen f food
park parks Park Parks m place,enclosed,through
garden gardens Garten Gärten m place,enclosed,through
kitchen kitchens Küche Küchen f place,enclosed,tidy
school schools Schule Schulen f place,enclosed
city cities Stadt Städte f place,enclosed,through
forest forests Wald Wälder m place,enclosed,through
station stations Bahnhof Bahnhöfe m place
river rivers Fluss Flüsse m place
street streets Straße Straßen f place,through
room rooms Zimmer Zimmer n place,enclosed,tidy
office offices Büro Büros n place,enclosed,tidy
market markets Markt Märkte m place,through
library libraries Bibliothek Bibliotheken f place,enclosed
house houses Haus Häuser n place,enclosed,buildable,paintable
village villages Dorf Dörfer n place,enclosed,through
museum museums Museum Museen n place,enclosed
""")


@dataclass(frozen=True)
class Adjective:
    en: str
    de: str  # predicative: "der Hund ist müde"
    stem: str  # before an ending: "der müde Hund", "ein müder Hund"
    kinds: str  # what it can describe


ADJECTIVES = [Adjective(en, de, stem, kinds) for en, de, stem, kinds in (
    ("big", "groß", "groß", "any"), ("small", "klein", "klein", "any"), ("old", "alt", "alt", "any"),
    ("young", "jung", "jung", "animate"), ("new", "neu", "neu", "thing,place"),
    ("red", "rot", "rot", "thing,food"), ("blue", "blau", "blau", "thing"), ("green", "grün", "grün", "thing,food"),
    ("black", "schwarz", "schwarz", "thing,animal"), ("white", "weiß", "weiß", "thing,animal"),
    ("beautiful", "schön", "schön", "any"), ("tired", "müde", "müd", "animate"),
    ("happy", "glücklich", "glücklich", "animate"), ("hungry", "hungrig", "hungrig", "animate"),
    ("quiet", "leise", "leis", "animate"), ("fast", "schnell", "schnell", "animate,vehicle"),
    ("good", "gut", "gut", "any"), ("friendly", "freundlich", "freundlich", "person"),
    ("strange", "seltsam", "seltsam", "any"), ("warm", "warm", "warm", "food,place"),
)]


@dataclass(frozen=True)
class Verb:
    en: tuple[str, str, str, str]  # base, 3rd person singular, past, participle ("look for" is two words)
    de: tuple[str, str, str, str]  # infinitive, 3rd singular present, past singular, participle
    frame: str  # "", "acc", "dat", "dat+acc", "that" (a clause)
    subject: str  # kinds of noun allowed as subject; "animate" = person or animal
    objects: str = ""  # kinds allowed as the object ("," separated; "dat+acc": recipient;thing)
    aux: str = "haben"  # the perfect's auxiliary: "sein" for motion
    prefix: str = ""  # German separable prefix: ruft … an
    de_1sg: str | None = None  # irregular first person singular (ich mag, ich weiß)
    motion: bool = False  # takes a direction ("into the garden" = "in den Garten")

    def de_present(self, person: str) -> str:
        infinitive, third, _, _ = self.de
        stem = infinitive[len(self.prefix):]
        if person == "1sg":
            return self.de_1sg or stem[:-1]
        return third if person == "3sg" else stem

    def de_past(self, person: str) -> str:
        past = self.de[2]
        return past if person.endswith("sg") else past + ("n" if past.endswith("e") else "en")


def _verb(en: str, de: str, frame: str, subject: str, objects: str = "", **extra: object) -> Verb:
    return Verb(tuple(en.split("|")), tuple(de.split("|")), frame, subject, objects, **extra)  # type: ignore[arg-type]


HAVE = _verb("have|has|had|had", "haben|hat|hatte|gehabt", "acc", "person", "thing,animal,food", de_1sg="habe")
VERBS = [
    _verb("see|sees|saw|seen", "sehen|sieht|sah|gesehen", "acc", "animate", "person,animal,thing,food,place"),
    _verb("find|finds|found|found", "finden|findet|fand|gefunden", "acc", "person", "animal,thing,food"),
    _verb("buy|buys|bought|bought", "kaufen|kauft|kaufte|gekauft", "acc", "person", "thing,food,animal"),
    _verb("read|reads|read|read", "lesen|liest|las|gelesen", "acc", "person", "readable"),
    _verb("write|writes|wrote|written", "schreiben|schreibt|schrieb|geschrieben", "acc", "person", "readable"),
    _verb("eat|eats|ate|eaten", "essen|isst|aß|gegessen", "acc", "person", "food"),
    _verb("cook|cooks|cooked|cooked", "kochen|kocht|kochte|gekocht", "acc", "person", "cookable"),
    _verb("carry|carries|carried|carried", "tragen|trägt|trug|getragen", "acc", "person", "thing,animal,food"),
    _verb("need|needs|needed|needed", "brauchen|braucht|brauchte|gebraucht", "acc", "person", "thing,food"),
    _verb("visit|visits|visited|visited", "besuchen|besucht|besuchte|besucht", "acc", "person", "person,place"),
    _verb("like|likes|liked|liked", "mögen|mag|mochte|gemocht", "acc", "animate", "person,animal,food",
          de_1sg="mag"),
    _verb("know|knows|knew|known", "kennen|kennt|kannte|gekannt", "acc", "person", "person,place"),
    _verb("wash|washes|washed|washed", "waschen|wäscht|wusch|gewaschen", "acc", "person", "animal,vehicle,cup"),
    _verb("open|opens|opened|opened", "öffnen|öffnet|öffnete|geöffnet", "acc", "person", "openable"),
    _verb("paint|paints|painted|painted", "malen|malt|malte|gemalt", "acc", "person", "paintable,animal,person"),
    _verb("sell|sells|sold|sold", "verkaufen|verkauft|verkaufte|verkauft", "acc", "person", "thing,food,animal"),
    _verb("build|builds|built|built", "bauen|baut|baute|gebaut", "acc", "person", "buildable"),
    _verb("look for|looks for|looked for|looked for", "suchen|sucht|suchte|gesucht", "acc", "animate",
          "person,animal,thing"),
    _verb("feed|feeds|fed|fed", "füttern|füttert|fütterte|gefüttert", "acc", "person", "animal",
          de_1sg="füttere"),
    _verb("lose|loses|lost|lost", "verlieren|verliert|verlor|verloren", "acc", "person", "thing"),
    _verb("hear|hears|heard|heard", "hören|hört|hörte|gehört", "acc", "animate", "person,animal"),
    HAVE,
    _verb("call|calls|called|called", "anrufen|ruft|rief|angerufen", "acc", "person", "person", prefix="an"),
    _verb("pick up|picks up|picked up|picked up", "abholen|holt|holte|abgeholt", "acc", "person",
          "person,thing", prefix="ab"),
    _verb("invite|invites|invited|invited", "einladen|lädt|lud|eingeladen", "acc", "person", "person",
          prefix="ein"),
    _verb("tidy up|tidies up|tidied up|tidied up", "aufräumen|räumt|räumte|aufgeräumt", "acc", "person", "tidy",
          prefix="auf"),
    _verb("help|helps|helped|helped", "helfen|hilft|half|geholfen", "dat", "person", "person,animal"),
    _verb("thank|thanks|thanked|thanked", "danken|dankt|dankte|gedankt", "dat", "person", "person"),
    _verb("follow|follows|followed|followed", "folgen|folgt|folgte|gefolgt", "dat", "animate", "person,animal",
          aux="sein"),
    _verb("answer|answers|answered|answered", "antworten|antwortet|antwortete|geantwortet", "dat", "person",
          "person"),
    _verb("give|gives|gave|given", "geben|gibt|gab|gegeben", "dat+acc", "person", "person,animal;thing,food"),
    _verb("show|shows|showed|shown", "zeigen|zeigt|zeigte|gezeigt", "dat+acc", "person", "person;thing,animal"),
    _verb("send|sends|sent|sent", "schicken|schickt|schickte|geschickt", "dat+acc", "person", "person;readable"),
    _verb("bring|brings|brought|brought", "bringen|bringt|brachte|gebracht", "dat+acc", "person",
          "person,animal;thing,food"),
    _verb("sleep|sleeps|slept|slept", "schlafen|schläft|schlief|geschlafen", "", "animate"),
    _verb("work|works|worked|worked", "arbeiten|arbeitet|arbeitete|gearbeitet", "", "person"),
    _verb("laugh|laughs|laughed|laughed", "lachen|lacht|lachte|gelacht", "", "person"),
    _verb("wait|waits|waited|waited", "warten|wartet|wartete|gewartet", "", "animate"),
    _verb("play|plays|played|played", "spielen|spielt|spielte|gespielt", "", "animate"),
    _verb("sing|sings|sang|sung", "singen|singt|sang|gesungen", "", "person"),
    _verb("dance|dances|danced|danced", "tanzen|tanzt|tanzte|getanzt", "", "person"),
    _verb("go|goes|went|gone", "gehen|geht|ging|gegangen", "", "person", aux="sein", motion=True),
    _verb("come|comes|came|come", "kommen|kommt|kam|gekommen", "", "animate", aux="sein", motion=True),
    _verb("run|runs|ran|run", "laufen|läuft|lief|gelaufen", "", "animate", aux="sein", motion=True),
    _verb("drive|drives|drove|driven", "fahren|fährt|fuhr|gefahren", "", "person", aux="sein", motion=True),
    _verb("swim|swims|swam|swum", "schwimmen|schwimmt|schwamm|geschwommen", "", "animate", aux="sein",
          motion=True),
]
SAYING = [  # verbs that take a "that" clause
    _verb("say|says|said|said", "sagen|sagt|sagte|gesagt", "that", "person"),
    _verb("know|knows|knew|known", "wissen|weiß|wusste|gewusst", "that", "person", de_1sg="weiß"),
    _verb("think|thinks|thought|thought", "denken|denkt|dachte|gedacht", "that", "person"),
    _verb("believe|believes|believed|believed", "glauben|glaubt|glaubte|geglaubt", "that", "person"),
    _verb("hope|hopes|hoped|hoped", "hoffen|hofft|hoffte|gehofft", "that", "person"),
]
BE = _verb("be|is|was|been", "sein|ist|war|gewesen", "", "any", aux="sein", de_1sg="bin")


@dataclass(frozen=True)
class Modal:
    en: tuple[str, str]  # present, past ("can", "could"); "want to" agrees: "wants to"
    de: tuple[str, str, str]  # singular present, plural present, past singular


MODALS = [Modal(("can", "could"), ("kann", "können", "konnte")),
          Modal(("want to", "wanted to"), ("will", "wollen", "wollte")),
          Modal(("must", "had to"), ("muss", "müssen", "musste"))]

PRONOUNS = [("I", "ich", "1sg"), ("he", "er", "3sg"), ("she", "sie", "3sg"), ("we", "wir", "1pl"),
            ("they", "sie", "3pl")]

# ------------------------------------------------------------------------------------------ inflection

DEFINITE = {"nom": ("der", "die", "das", "die"), "acc": ("den", "die", "das", "die"),
            "dat": ("dem", "der", "dem", "den")}
THIS = {"nom": ("dieser", "diese", "dieses", "diese"), "acc": ("diesen", "diese", "dieses", "diese"),
        "dat": ("diesem", "dieser", "diesem", "diesen")}
EIN_ENDINGS = {"nom": ("", "e", "", "e"), "acc": ("en", "e", "", "e"), "dat": ("em", "er", "em", "en")}
WEAK = {"nom": ("e", "e", "e", "en"), "acc": ("en", "e", "e", "en"), "dat": ("en", "en", "en", "en")}
MIXED = {"nom": ("er", "e", "es", "en"), "acc": ("en", "e", "es", "en"), "dat": ("en", "en", "en", "en")}
STRONG_PLURAL = {"nom": "e", "acc": "e", "dat": "en"}
# English determiner → German ein-word stem ("a" becomes "kein" under negation)
EIN_WORDS = {"a": "ein", "my": "mein", "our": "unser", "his": "sein", "her": "ihr", "no": "kein"}
CONTRACTIONS = {("in", "dem"): "im", ("in", "das"): "ins", ("an", "dem"): "am", ("zu", "dem"): "zum",
                ("zu", "der"): "zur"}

ONES = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
        "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
EINS = ["", "ein", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn", "elf", "zwölf",
        "dreizehn", "vierzehn", "fünfzehn", "sechzehn", "siebzehn", "achtzehn", "neunzehn"]
ZIG = ["", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig"]
ORDINALS_EN = {1: "first", 2: "second", 3: "third", 5: "fifth", 8: "eighth", 9: "ninth", 12: "twelfth"}
ORDINALS_DE = {1: "ersten", 3: "dritten", 7: "siebten", 8: "achten"}
MONTHS = [("January", "Januar", 31), ("February", "Februar", 28), ("March", "März", 31), ("April", "April", 30),
          ("May", "Mai", 31), ("June", "Juni", 30), ("July", "Juli", 31), ("August", "August", 31),
          ("September", "September", 30), ("October", "Oktober", 31), ("November", "November", 30),
          ("December", "Dezember", 31)]
DAYS = [("Monday", "Montag"), ("Tuesday", "Dienstag"), ("Wednesday", "Mittwoch"), ("Thursday", "Donnerstag"),
        ("Friday", "Freitag"), ("Saturday", "Samstag"), ("Sunday", "Sonntag")]


def prepositional(en: str, de: str, phrase: Phrase) -> Phrase:
    """A prepositional phrase, contracting the German article where German must: "in dem Garten" → "im
    Garten", the contraction translating both the preposition and the article ("im" ← "in the")."""
    prep = english_words(en)
    article = phrase.de[0]
    contracted = CONTRACTIONS.get((de, article))
    if contracted:
        return Phrase(prep + phrase.en, [Word(contracted, [*prep, *article.sure]), *phrase.de[1:]])
    return Phrase(prep + phrase.en, translating(de, prep) + phrase.de)


def number_en(n: int) -> str:
    """1 ≤ n ≤ 9999 in American English words: "three hundred twenty-one"."""
    words = []
    thousands, rest = divmod(n, 1000)
    hundreds, rest = divmod(rest, 100)
    if thousands:
        words += [ONES[thousands], "thousand"]
    if hundreds:
        words += [ONES[hundreds], "hundred"]
    if rest:
        tens, ones = divmod(rest, 10)
        words.append(ONES[rest] if rest < 20 else TENS[tens] + (f"-{ONES[ones]}" if ones else ""))
    return " ".join(words)


def number_de(n: int) -> str:
    """1 ≤ n ≤ 9999 as one German word, units before tens: 321 → "dreihunderteinundzwanzig" (1 → "ein")."""
    thousands, rest = divmod(n, 1000)
    hundreds, rest = divmod(rest, 100)
    word = (EINS[thousands] + "tausend" if thousands else "") + (EINS[hundreds] + "hundert" if hundreds else "")
    if rest:
        tens, ones = divmod(rest, 10)
        word += EINS[rest] if rest < 20 else (EINS[ones] + "und" if ones else "") + ZIG[tens]
    return word


def ordinal_en(n: int) -> str:
    if n in ORDINALS_EN:
        return ORDINALS_EN[n]
    if n < 20:
        return ONES[n] + "th"
    tens, ones = divmod(n, 10)
    return TENS[tens][:-1] + "ieth" if not ones else f"{TENS[tens]}-{ordinal_en(ones)}"


def ordinal_de(n: int) -> str:
    """The dative ordinal of a date: "am dritten", "am einundzwanzigsten"."""
    if n in ORDINALS_DE:
        return ORDINALS_DE[n]
    return number_de(n) + ("ten" if n < 20 else "sten")


# ---------------------------------------------------------------------------------------- noun phrases


@dataclass(frozen=True)
class NounPhrase:
    noun: Noun
    plural: bool
    det: str  # English: the, a, this, my, our, his, her, a number as digits, or "" (a bare plural)
    adjective: Adjective | None = None

    @property
    def person(self) -> str:
        return "3pl" if self.plural else "3sg"

    def en(self) -> str:
        return _joined(self.en_parts())

    def de(self, case: str, negated: bool = False) -> str:
        """The German phrase in `case`; `negated` turns "a dog"/"dogs" into "keinen Hund"/"keine Hunde"."""
        return _joined(self.de_parts(case, negated))

    def aligned(self, case: str, negation: Word | None = None) -> Phrase:
        """The phrase in both languages, each German part translating the same English part; under a
        `negation` ("not") that turns it into "kein…", the article translates that word too."""
        en: list[Word] = []
        de: list[Word] = []
        for part, (en_text, de_text) in enumerate(zip(self.en_parts(), self.de_parts(case, negation is not None),
                                                      strict=True)):
            words = english_words(en_text)
            en += words
            de += translating(de_text, [*words, negation] if negation and part == 0 else words)
        return Phrase(en, de)

    def en_parts(self) -> tuple[str, str, str]:
        """Determiner, adjective and noun; the determiner is several words for a number, and it and the
        adjective may be empty."""
        noun = self.noun.en_pl if self.plural else self.noun.en
        adjective = self.adjective.en if self.adjective else ""
        if self.det == "a":
            det = "an" if (adjective or noun)[0] in "aeiou" else "a"
        elif self.det == "this" and self.plural:
            det = "these"
        else:
            det = number_en(int(self.det)) if self.det.isdigit() else self.det
        return det, adjective, noun

    def de_parts(self, case: str, negated: bool = False) -> tuple[str, str, str]:
        """Article, adjective and noun, each one word or (article, adjective) empty, in `case`."""
        column = 3 if self.plural else GENDERS.index(self.noun.gender)
        det = "no" if negated and self.det in ("a", "") else self.det
        if det == "the":
            article, endings = DEFINITE[case][column], WEAK
        elif det == "this":
            article, endings = THIS[case][column], WEAK
        elif det in EIN_WORDS:
            article, endings = EIN_WORDS[det] + EIN_ENDINGS[case][column], MIXED
        else:  # a number or nothing: strong adjective endings (always plural here)
            article, endings = number_de(int(det)) if det else "", None
        adjective = ""
        if self.adjective:
            adjective = self.adjective.stem + (endings[case][column] if endings else STRONG_PLURAL[case])
        return article, adjective, self.noun.de_form(self.plural, case)

    @property
    def negatable(self) -> bool:
        """Negating "a dog" / "dogs" uses kein instead of nicht."""
        return self.det in ("a", "")


def _joined(parts: tuple[str, ...]) -> str:
    return " ".join(part for part in parts if part)
