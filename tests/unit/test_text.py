"""Reply text: UTF-8 split across tokens, stop strings across token boundaries."""

from workbench.engine.text import ReplyText


def feed(rt: ReplyText, pieces: list[bytes]) -> list[str]:
    return [rt.push(p) for p in pieces]


def test_utf8_character_split_over_two_tokens_is_held_back():
    rt = ReplyText(())
    euro = "€".encode()
    assert feed(rt, [b"a", euro[:1], euro[1:]]) == ["a", "", "€"]
    assert rt.reply == "a€"


def test_stop_across_token_boundary_is_trimmed_and_never_leaks():
    rt = ReplyText(("END",))
    shown = feed(rt, [b"hello E", b"N", b"D more"])
    assert "".join(shown) == "hello "
    assert rt.stop_hit == "END" and rt.reply == "hello "
    assert all("E" not in s for s in shown)


def test_partial_stop_that_does_not_complete_is_released():
    rt = ReplyText(("END",))
    shown = feed(rt, [b"x E", b"N", b"x"])
    assert "".join(shown) == "x ENx"
    assert rt.stop_hit is None


def test_flush_releases_held_text_at_end():
    rt = ReplyText(("END",))
    assert rt.push(b"abc EN") == "abc "
    assert rt.flush() == "EN"
    assert rt.reply == "abc EN"


def test_earliest_of_several_stops_wins():
    rt = ReplyText(("\n\n", "bar"))
    assert rt.push(b"foo bar\n\nbaz") == "foo "
    assert rt.stop_hit == "bar"
