"""Small real-language parallel corpora, generated offline.

Dates are rendered by Babel's CLDR data and numbers spelled out by
num2words: real month names, word orders and compounds of several
languages, with no download. Both need the `[examples]` extra.
"""

import datetime
import random

from keras_attention.datasets._checks import check_integer
from keras_attention.datasets._checks import speller
from keras_attention.datasets.parallel_corpus import ParallelCorpus

DATE_LOCALES = ("en_US", "de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL")
DATE_FORMATS = ("medium", "long", "full")


def load_dates(
    num_examples: int = 20000,
    locales=DATE_LOCALES,
    seed: int = 0,
    first_year: int = 1950,
    last_year: int = 2049,
) -> ParallelCorpus:
    """Dates written out in several languages, to ISO 8601.

    Sources are Babel renderings such as `"Sonntag, 29. November 2026"`
    (de_DE, full) or `"Nov 29, 2026"` (en_US, medium); targets are
    `"2026-11-29"`. The day comes before the month in most locales and
    after it in English, so the model must reorder.

    Args:
        num_examples: Pairs drawn (before removing repeated sources).
        locales (tuple[str, ...]): CLDR locale names.
        seed: Same seed, same corpus and splits.
        first_year: Earliest year.
        last_year: Latest year.

    Returns:
        A `ParallelCorpus` split 80/10/10.

    Examples:
        >>> corpus = load_dates(200, seed=1)
        >>> source, target = corpus.train[0]
        >>> len(target), target[4], target[7]
        (10, '-', '-')
    """
    from babel import Locale
    from babel import UnknownLocaleError
    from babel.dates import format_date

    where = "load_dates"
    check_integer(where, "num_examples", num_examples, 1)
    check_integer(where, "first_year", first_year, datetime.MINYEAR)
    check_integer(where, "last_year", last_year, first_year)
    if last_year > datetime.MAXYEAR:
        raise ValueError(
            f"{where}: `last_year` must be at most {datetime.MAXYEAR}. "
            f"Received: last_year={last_year!r}"
        )
    if isinstance(locales, str) or not locales:
        raise ValueError(
            f"{where}: `locales` must be a non-empty sequence of locale "
            f"names such as ('de_DE',). Received: locales={locales!r}"
        )
    for locale in locales:
        try:
            Locale.parse(locale)
        except (UnknownLocaleError, ValueError, TypeError) as error:
            raise ValueError(
                f"{where}: `locales` must hold CLDR locale names such as "
                f"'de_DE'. Received: {locale!r} in locales={locales!r}"
            ) from error
    locales = tuple(locales)
    rng = random.Random(seed)
    first = datetime.date(first_year, 1, 1).toordinal()
    last = datetime.date(last_year, 12, 31).toordinal()
    pairs = []
    for _ in range(num_examples):
        date = datetime.date.fromordinal(rng.randint(first, last))
        locale = rng.choice(locales)
        text = format_date(date, rng.choice(DATE_FORMATS), locale=locale)
        pairs.append((text, date.isoformat()))
    return ParallelCorpus.from_pairs("dates", pairs, seed=seed)


def load_numbers(
    num_examples: int = 20000,
    source_language: str = "de",
    target_language: str = "en",
    max_value: int = 9999,
    seed: int = 0,
) -> ParallelCorpus:
    """Numbers spelled out in one language, to another (or to digits).

    German writes 24 as `"vierundzwanzig"` (four-and-twenty) where English
    writes `"twenty-four"`: a translation model has to read the end of the
    source first. `target_language="digits"` gives `"24"`.

    Args:
        num_examples: Numbers drawn (before removing repeats).
        source_language: A num2words language code.
        target_language: A num2words language code or `"digits"`.
        max_value: Largest number.
        seed: Same seed, same corpus and splits.

    Returns:
        A `ParallelCorpus` split 80/10/10.

    Examples:
        >>> corpus = load_numbers(300, max_value=99, seed=0)
        >>> pairs = dict(corpus.train + corpus.validation + corpus.test)
        >>> pairs["vierundzwanzig"]
        'twenty-four'
    """
    where = "load_numbers"
    check_integer(where, "num_examples", num_examples, 1)
    check_integer(where, "max_value", max_value, 0)
    spell_source = speller(where, "source_language", source_language)
    spell_target = (
        str
        if target_language == "digits"
        else speller(where, "target_language", target_language)
    )
    rng = random.Random(seed)
    pairs = []
    for _ in range(num_examples):
        number = rng.randint(0, max_value)
        pairs.append((spell_source(number), spell_target(number)))
    return ParallelCorpus.from_pairs(
        f"numbers-{source_language}-{target_language}", pairs, seed=seed
    )


def load_tsv(path, seed: int = 0, max_pairs=None) -> ParallelCorpus:
    """Reads `source<TAB>target` lines (Tatoeba / Anki `manythings` files).

    Further tab-separated columns (attribution) are ignored, as are empty
    and malformed lines.

    Args:
        path (str | os.PathLike): A UTF-8 text file (with or without a
            byte-order mark).
        seed: Split seed.
        max_pairs (int | None): Keep the first `max_pairs` lines.

    Returns:
        A `ParallelCorpus` split 80/10/10.

    Examples:
        >>> import pathlib
        >>> import tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "fra.txt"
        >>> _ = path.write_text("Go.\\tVa !\\tCC-BY 2.0\\nHi.\\tSalut !\\n")
        >>> corpus = load_tsv(path)
        >>> sorted(corpus.train + corpus.validation + corpus.test)
        [('Go.', 'Va !'), ('Hi.', 'Salut !')]
    """
    if max_pairs is not None:
        check_integer("load_tsv", "max_pairs", max_pairs, 1)
    pairs = []
    # utf-8-sig: a byte-order mark, as some editors write, is not text.
    with open(path, encoding="utf-8-sig") as handle:
        for line in handle:
            if max_pairs is not None and len(pairs) >= max_pairs:
                break
            columns = line.rstrip("\n").split("\t")
            if len(columns) >= 2 and columns[0].strip() and columns[1].strip():
                pairs.append((columns[0].strip(), columns[1].strip()))
    if not pairs:
        raise ValueError(
            "load_tsv: no `source<TAB>target` line found. "
            f"Received: path={path}"
        )
    return ParallelCorpus.from_pairs(str(path), pairs, seed=seed)
