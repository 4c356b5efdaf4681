"""The check every refusal test makes: the error is one line and names what it must."""


def one_line(excinfo, *words) -> str:
    """The message of a pytest.raises ExceptionInfo, asserted to be one line holding each
    of `words`."""
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    return msg
