"""``relpos_lab.arguments``: the text of a command-line flag parsed into numbers or names, every
failure one ``ValueError`` that names the flag and the expected form."""

import pytest

from relpos_lab.arguments import parse_float_list, parse_int_list, parse_names


def test_float_list_reads_text_and_sequences_and_skips_empty_items():
    assert parse_float_list("1, 2.5,,4", "--x") == [1.0, 2.5, 4.0]
    assert parse_float_list([0.5, "2"], "--x") == [0.5, 2.0]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("1,abc", "--depths must be comma-separated numbers, got 'abc'"),
        ("1,nan", "got 'nan'"),
        ("inf", "got 'inf'"),
        ("", "--depths is empty"),
        (" , ", "--depths is empty"),
    ],
)
def test_float_list_refuses_what_is_not_a_finite_number(value, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_float_list(value, "--depths")


def test_float_list_checks_bounds_with_the_flags_own_wording():
    assert parse_float_list("0.1,1", "--d", minimum=0, maximum=1) == [0.1, 1.0]
    with pytest.raises(ValueError, match="--eval-mult must be positive numbers, got '0'"):
        parse_float_list("1,0", "--eval-mult", expected="positive numbers", above=0)
    with pytest.raises(ValueError, match="got 1.5"):
        parse_float_list([1.5], "--d", maximum=1)


def test_int_list_and_names_refuse_empty_items():
    assert parse_int_list("1024,2048", "--lengths") == [1024, 2048]
    with pytest.raises(ValueError, match="--lengths must be comma-separated integers"):
        parse_int_list("1024,,2048", "--lengths")
    assert parse_names("rope, alibi,rope", "--encodings") == ["rope", "alibi"]
    with pytest.raises(ValueError, match="--encodings has an empty name"):
        parse_names("rope,,alibi", "--encodings")


def test_a_comma_inside_brackets_belongs_to_its_name():
    names = parse_names("prope:image_size=(32, 32),rope", "--encodings")
    assert names == ["prope:image_size=(32, 32)", "rope"]
    assert parse_names("a:x=[1,2],b:y={'k': 1}", "--encodings") == ["a:x=[1,2]", "b:y={'k': 1}"]
