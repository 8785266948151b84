"""Argument checks shared by the dataset loaders."""


def check_integer(where: str, name: str, value, low: int):
    """`value` is a Python integer (not a bool) of at least `low`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(
            f"{where}: `{name}` must be an integer >= {low!r}. "
            f"Received: {name}={value!r}"
        )


def speller(where: str, name: str, language: str):
    """num2words for `language`, checked on one number first."""
    from num2words import num2words

    try:
        num2words(0, lang=language)
    except (NotImplementedError, KeyError, TypeError) as error:
        raise ValueError(
            f"{where}: `{name}` must be a num2words language code such as "
            f"'en'. Received: {name}={language!r}"
        ) from error
    return lambda number: num2words(number, lang=language)
