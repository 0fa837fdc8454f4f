use super::page::*;

#[test]
fn prose_escapes_markup_outside_code() {
    assert_eq!(
        prose("a <name> `x|<y>` *b* snake_case _c_", true),
        "a \\<name\\> `x\\|<y>` \\*b\\* snake_case \\_c\\_"
    );
    assert_eq!(prose("one\ntwo\n\nthree", true), "one two<br><br>three");
    assert_eq!(prose("unclosed ` tick", false), "unclosed \\` tick");
}

#[test]
fn code_spans_hold_backticks() {
    assert_eq!(code("a`b", false), "``a`b``");
    assert_eq!(code("`a", false), "`` `a ``");
    assert_eq!(code("a||b", true), "`a\\|\\|b`");
}

#[test]
fn slugs_like_github() {
    assert_eq!(
        slug("Shim.spec.fetchStrategy.platforms[]"),
        "shimspecfetchstrategyplatforms"
    );
    assert_eq!(
        slug("shim-agent containerd get"),
        "shim-agent-containerd-get"
    );
}
