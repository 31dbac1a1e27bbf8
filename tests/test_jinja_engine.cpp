// The template engine's pieces on their own: expressions, filters, tests,
// whitespace control, loops and loop controls, scopes and macros, globals
// (each expected text is what Jinja2 3.1, set up as tests/jinja/jinja_oracle.py
// sets it up, renders for the same template and variables); then errors with
// their lines, the limits, and renders on several threads at once.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "jinja/template.h"

namespace {

using kvs::jinja::Error;
using kvs::jinja::ErrorKind;
using kvs::jinja::RenderOptions;
using kvs::jinja::Template;
using nlohmann::ordered_json;

struct Case {
  const char* source;
  const char* expected;
};

const ordered_json& vars() {
  static const ordered_json v = ordered_json::parse(R"({
    "msgs": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}],
    "d": {"b": 1, "a": [1, 2], "items": "key"}, "s": "Grüße, world", "n": null})");
  return v;
}

std::tm fixed_time() {
  std::tm t{};
  t.tm_year = 126, t.tm_mon = 0, t.tm_mday = 15, t.tm_hour = 10, t.tm_min = 30, t.tm_wday = 4, t.tm_yday = 14;
  return t;
}

std::string render(const std::string& source, const ordered_json& v = vars(), RenderOptions opt = {}) {
  if (!opt.clock) opt.clock = fixed_time;
  return Template(source, "t").render(v, opt);
}

void check(const Case* cases, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    try {
      EXPECT_EQ(render(cases[i].source), cases[i].expected) << cases[i].source;
    } catch (const Error& e) {
      ADD_FAILURE() << cases[i].source << ": " << e.what();
    }
  }
}

// What a template fails with: its kind and line.
std::pair<ErrorKind, int> failure(const std::string& source, const ordered_json& v = vars(), RenderOptions opt = {}) {
  try {
    render(source, v, opt);
  } catch (const Error& e) {
    return {e.kind(), e.line()};
  }
  ADD_FAILURE() << "no error from " << source;
  return {ErrorKind::Render, -1};
}

const Case kExpressions[] = {
    {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / "
     "2 }}",
     "7 9 64 4 3 -4 2 3.5"},
    {"{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' ~ 1 ~ none ~ true }} {{ 'b' in 'abc' }} {{ "
     "4 not in [1, 2] }}",
     "True False True True a1NoneTrue True True"},
    {"{{ 'yes' if d.b else 'no' }}|{{ 'x' if false }}|{{ n or 'fallback' }}|{{ d.b and 'both' }}|{{ not n }}",
     "yes||fallback|both|True"},
    {"{{ s[0] }}{{ s[-5:] }}|{{ s[::-1] }}|{{ [1, 2, 3][1:] }}|{{ s|length }}|{{ 'a' 'b' }}|{{ "
     "'tab\\there\\u00e9\\x21' }}",
     "Gworld|dlrow ,eßürG|[2, 3]|12|ab|tab\thereé!"},
    {"{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}, (1,)] }}|{{ 1e20 }} {{ 1.5e-5 }} {{ 0.1 + 0.2 }} {{ 3.0 }}",
     "[1, 'a', None, True, 1.5, {'k': \"it's\"}, (1,)]|1e+20 1.5e-05 0.30000000000000004 3.0"},
    {"{{ d.b }} {{ d['a'][1] }} {{ d.a.0 }} {{ d.items()|list }} {{ d['items'] }} {{ d.get('zz') }} {{ d.get('zz', 0) "
     "}}",
     "1 2 1 [('b', 1), ('a', [1, 2]), ('items', 'key')] key None 0"},
    {"{{ '%s=%05.1f' % ('x', 3.14159) }}|{{ '{}-{:>4}'.format('a', 7) }}|{{ 'a,b'.split(',') }}|{{ '  t  '.strip() "
     "}}|{{ 'ab'.upper() }}|{{ 'x'.startswith(('a', 'x')) }}",
     "x=003.1|a-   7|['a', 'b']|t|AB|True"},
};
const Case kFilters[] = {
    {"{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(', ') }}|{{ msgs|rejectattr('role', "
     "'eq', 'user')|list|length }}",
     "Hi, Bye|2"},
    {"{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ [3, 1, 2]|sort(reverse=true)|first }} {{ [1, 2, 2, "
     "1]|unique|list }} {{ [1, 2]|reverse|list }} {{ d|dictsort }}",
     "[1, 2, 3] ['A', 'b', 'c'] 3 [1, 2] [2, 1] [('a', [1, 2]), ('b', 1), ('items', 'key')]"},
    {"{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ 'Grüße \"q\"\\n'|tojson }}|{{ s|tojson(ensure_ascii=true) }}|{{ {'b': "
     "1, 'a': 2}|tojson(sort_keys=true, separators=(',', ':')) }}",
     "{\"b\": 1, \"a\": [1, 2], \"items\": \"key\"}|{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2\n  ],\n  \"items\": "
     "\"key\"\n}|\"Grüße \\\"q\\\"\\n\"|\"Gr\\u00fc\\u00dfe, world\"|{\"a\":2,\"b\":1}"},
    {"{{ '  pad  '|trim }}|{{ n|default('none') }}|{{ undefined_name|default('dflt') }}|{{ ''|default('empty', true) "
     "}}|{{ [1, 2]|first }}{{ [1, 2]|last }}|{{ 'abc'|list }}|{{ d|items|list }}",
     "pad|None|dflt|empty|12|['a', 'b', 'c']|[('b', 1), ('a', [1, 2]), ('items', 'key')]"},
    {"{{ '42'|int + 1 }} {{ 'x'|int }} {{ '4.5'|float }} {{ 2.5|round }} {{ 3.14159|round(2) }} {{ -3|abs }} {{ [1, 2, "
     "3]|sum }} {{ [4, 2]|min }} {{ 'a b c'|wordcount }}",
     "43 0 4.5 2.0 3.14 3 6 2 3"},
    {"{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'abc'|replace('b', 'B') "
     "}}|{{ '<a href=\"x\">'|e }}|{{ 'abcdefghij'|truncate(7, true, '..', 0) }}|{{ 'c'|center(5) }}",
     "Hello World|Hello|  a\n  b|aBc|&lt;a href=&#34;x&#34;&gt;|abcde..|  c  "},
    {"{{ ('<b>'|safe) + '<i>' }}|{{ '<' + ('&'|safe) }}|{{ ('<b>'|safe) ~ '<i>' }}|{{ ('x'|safe) is escaped }}|{{ "
     "'%s'|format('<') }}",
     "<b>&lt;i&gt;|&lt;&|<b><i>|True|<"},
};
const Case kTests[] = {
    {"{{ n is none }} {{ d is mapping }} {{ s is string }} {{ 1 is number }} {{ true is boolean }} {{ d.a is sequence "
     "}} {{ undefined_name is defined }} {{ d.zz is undefined }}",
     "True True True True True True False True"},
    {"{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 1 is equalto 1 }} {{ 2 is eq 3 }} {{ 'a' is in 'abc' "
     "}} {{ true is true }} {{ 1 is true }} {{ n is not none }}",
     "True True True True False True True False False"},
    {"{{ s is iterable }} {{ 1 is iterable }} {{ undefined_name is iterable }} {{ msgs|selectattr('role') is sequence "
     "}} {{ range is callable }} {{ 'A' is upper }}",
     "True False True False True True"},
};
const Case kWhitespace[] = {
    {"a\n  {% if true %}\n    b\n  {% endif %}\nc", "a\n    b\nc"},
    {"a\n  {%- if true -%}\n    b\n  {%- endif -%}\nc", "abc"},
    {"a\n  {%+ if true %}\n    b\n  {% endif +%}\nc", "a\n      b\n\nc"},
    {"a {# comment #} b\n  {# alone #}\nc\n", "a  b\nc"},
    {"{{ 'x' }}\n  {{- 'y' -}}  \n  z", "xyz"},
    {"{% raw %}\n  {{ kept }}{% if %}\n{% endraw %}", "\n  {{ kept }}{% if %}\n"},
    {"l1\r\nl2\rl3\n\n", "l1\nl2\nl3\n"},
};
const Case kLoops[] = {
    {"{% for m in msgs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ "
     "loop.length }};{% endfor %}",
     "104TrueFalse4;213FalseFalse4;322FalseFalse4;431FalseTrue4;"},
    {"{% for m in msgs if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}:{{ m.content }}{{ ',' if not "
     "loop.last }}{% endfor %}",
     "1/3:Hi,2/3:Hello,3/3:Bye"},
    {"{% for m in msgs %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>{{ loop.nextitem.role if not "
     "loop.last else '-' }} {% endfor %}",
     "->user system>assistant user>user assistant>- "},
    {"{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% "
     "endfor %}",
     "0246"},
    {"{% for i in [] %}x{% else %}empty{% endfor %}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for c "
     "in 'ab' %}{{ loop.cycle('x', 'y') }}{{ c }}{% endfor %}",
     "empty|b=1;a=[1, 2];items=key;|xayb"},
    {"{% for x in [1, [2, [3]]] recursive %}{% if x is iterable %}({{ loop(x) }}){% else %}{{ x }}@{{ loop.depth }}{% "
     "endif %}{% endfor %}",
     "1@1(2@2(3@3))"},
};
const Case kScopes[] = {
    {"{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }} {% endfor %}{{ x }}", "110 120 1"},
    {"{% set ns = namespace(n=0, seen=[]) %}{% for m in msgs %}{% set ns.n = ns.n + 1 %}{% set ns.seen = ns.seen + "
     "[m.role] %}{% endfor %}{{ ns.n }} {{ ns.seen }}",
     "4 ['system', 'user', 'assistant', 'user']"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set blk %} in {{ a }} {% endset %}[{{ blk }}]|{% set up | upper | trim %} "
     "shout {% endset %}[{{ up }}]",
     "12|[ in 1 ]|[SHOUT]"},
    {"{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ "
     "greet('Bo', greeting='Hi') }} {{ greet('Cy', 'Yo') }}",
     "Hello, Ann! Hi, Bo! Yo, Cy!"},
    {"{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}|{% macro wrap() %}[{{ caller() "
     "}}]{% endmacro %}{% call wrap() %}body{% endcall %}",
     "1(2,){'k': 3}|[body]"},
    {"{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(v) each([1, 2]) %}<{{ v "
     "}}>{% endcall %}|{% filter upper %}up {{ 1 }}{% endfilter %}|{% with q = 2 %}{{ q }}{% endwith %}{{ q }}",
     "<1><2>|UP 1|2"},
    {"{% set t = 1 %}{% macro show() %}{{ t }}{% endmacro %}{% set t = 2 %}{{ show() }}|{% if true %}{% set leak = 'if "
     "has no scope' %}{% endif %}{{ leak }}",
     "2|if has no scope"},
};
const Case kGlobals[] = {
    {"{{ range(3)|list }} {{ range(1, 8, 3)|list }} {{ dict(a=1) }} {{ namespace(a=1).a }} {{ strftime_now('%Y-%m-%d "
     "%H:%M %a') }}",
     "[0, 1, 2] [1, 4, 7] {'a': 1} 1 2026-01-15 10:30 Thu"},
    {"{% set j = joiner('+') %}{% for i in [1, 2, 3] %}{{ j() }}{{ i }}{% endfor %}", "1+2+3"},
};

}  // namespace

TEST(JinjaEngine, Expressions) { check(kExpressions, std::size(kExpressions)); }
TEST(JinjaEngine, Filters) { check(kFilters, std::size(kFilters)); }
TEST(JinjaEngine, Tests) { check(kTests, std::size(kTests)); }
TEST(JinjaEngine, WhitespaceControl) { check(kWhitespace, std::size(kWhitespace)); }
TEST(JinjaEngine, LoopsAndLoopControls) { check(kLoops, std::size(kLoops)); }
TEST(JinjaEngine, ScopesMacrosAndBlocks) { check(kScopes, std::size(kScopes)); }
TEST(JinjaEngine, Globals) { check(kGlobals, std::size(kGlobals)); }

TEST(JinjaEngine, UndefinedAsJinja2) {
  // Printing, iterating, testing and defaulting an undefined value work;
  // an attribute of it, arithmetic on it or calling it raise.
  EXPECT_EQ(render("[{{ nope }}][{% for x in nope %}x{% endfor %}][{{ nope|length }}][{{ nope is defined }}]"),
            "[][][0][False]");
  EXPECT_EQ(render("{{ d.missing is defined }}|{{ d.missing|default('x') }}|{{ n.attr is defined }}"), "False|x|False");
  EXPECT_EQ(failure("{{ nope.attr }}").first, ErrorKind::Render);
  EXPECT_EQ(failure("{{ d.missing.deeper }}").first, ErrorKind::Render);
  EXPECT_EQ(failure("{{ nope + 1 }}").first, ErrorKind::Render);
  EXPECT_EQ(failure("{{ nope() }}").first, ErrorKind::Render);
  EXPECT_EQ(failure("{{ nope|tojson }}").first, ErrorKind::Render);
  EXPECT_EQ(failure("{% for x in n %}{% endfor %}").first, ErrorKind::Render);  // None is not iterable
}

TEST(JinjaEngine, SandboxRefusesMutation) {
  // The immutable sandbox: list.append and dict.pop exist but may not be called.
  EXPECT_EQ(render("{{ d.a.append is defined }}"), "False");
  EXPECT_EQ(failure("{% set _ = d.a.append(3) %}").first, ErrorKind::Render);
  EXPECT_EQ(failure("{{ d.pop('b') }}").first, ErrorKind::Render);
}

TEST(JinjaEngine, GeneratorFiltersBehaveAsGenerators) {
  // select / map results are consumed once, are always true and have no length.
  EXPECT_EQ(render("{% set g = msgs|map(attribute='role') %}{{ g|list|length }}-{{ g|list|length }}"), "4-0");
  EXPECT_EQ(render("{{ 'yes' if msgs|selectattr('role', 'equalto', 'tool') else 'no' }}"), "yes");
  EXPECT_EQ(failure("{{ msgs|selectattr('role')|length }}").first, ErrorKind::Render);
  EXPECT_EQ(failure("{{ msgs|selectattr('role')|tojson }}").first, ErrorKind::Render);
}

TEST(JinjaEngine, SyntaxErrorsNameTheLine) {
  EXPECT_EQ(failure("line 1\n{% if x %}\nno end"), std::make_pair(ErrorKind::Syntax, 3));
  EXPECT_EQ(failure("a\nb\n{% endfor %}"), std::make_pair(ErrorKind::Syntax, 3));
  EXPECT_EQ(failure("a\n{{ 1 + }}"), std::make_pair(ErrorKind::Syntax, 2));
  EXPECT_EQ(failure("a\n\n{% unknowntag %}"), std::make_pair(ErrorKind::Syntax, 3));
  EXPECT_EQ(failure("{{ 'unterminated }}").first, ErrorKind::Syntax);
  EXPECT_EQ(failure("{# never closed").first, ErrorKind::Syntax);
  EXPECT_EQ(failure("x\n{{ v|no_such_filter }}"), std::make_pair(ErrorKind::Syntax, 2));
  EXPECT_EQ(failure("{% break %}").first, ErrorKind::Syntax);
  // As in Jinja2, an unknown filter inside an if fails only when it runs.
  EXPECT_EQ(render("{% if false %}{{ v|no_such_filter }}{% endif %}ok"), "ok");
  EXPECT_EQ(failure("{% if true %}\n{{ v|no_such_filter }}{% endif %}"), std::make_pair(ErrorKind::Render, 2));
  try {
    Template("{{ a }}\n{% for %}", "my-template");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("my-template, line 2: ", 0), 0u) << e.what();
  }
}

TEST(JinjaEngine, RenderErrorsNameTheLine) {
  EXPECT_EQ(failure("ok\n{{ 1 / 0 }}"), std::make_pair(ErrorKind::Render, 2));
  EXPECT_EQ(failure("a\nb\n{{ 'x' + 1 }}"), std::make_pair(ErrorKind::Render, 3));
  EXPECT_EQ(failure("{% for m in msgs %}\n{% if m.role == 'user' %}\n{{ m.content.nope.x }}{% endif %}{% endfor %}"),
            std::make_pair(ErrorKind::Render, 3));
  try {
    render(
        "{% for m in msgs %}\n{% if m.role == 'assistant' %}{{ raise_exception('Roles must alternate!') }}"
        "{% endif %}{% endfor %}");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Raised);
    EXPECT_EQ(e.line(), 2);
    EXPECT_EQ(e.message(), "Roles must alternate!");
  }
}

TEST(JinjaEngine, LimitsStopHostileTemplates) {
  RenderOptions small;
  small.limits.max_steps = 100000;
  small.limits.max_loop_iterations = 10000;
  small.limits.max_output_bytes = 1 << 16;
  small.limits.max_work_bytes = 1 << 20;
  small.limits.max_call_depth = 20;
  EXPECT_EQ(
      failure("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", vars(), small).first,
      ErrorKind::Limit);
  EXPECT_EQ(failure("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", vars(), small).first, ErrorKind::Limit);
  EXPECT_EQ(failure("{% for i in range(5000) %}{{ 'x' * 100 }}{% endfor %}", vars(), small).first, ErrorKind::Limit);
  EXPECT_EQ(failure("{{ 'x' * 100000000 }}", vars(), small).first, ErrorKind::Limit);
  EXPECT_EQ(failure("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                    vars(), small)
                .first,
            ErrorKind::Limit);
  // The default limits hold too; the sandbox's range cap is Jinja2's error.
  EXPECT_EQ(failure("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}").first, ErrorKind::Limit);
  EXPECT_EQ(failure("{{ range(1000000)|length }}").first, ErrorKind::Render);
  // Nesting that would exhaust the parser's stack is a syntax error.
  EXPECT_EQ(failure("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").first, ErrorKind::Syntax);
  EXPECT_EQ(failure("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}").first, ErrorKind::Syntax);
  std::string deep;
  for (int i = 0; i < 500; ++i) deep += "{% if true %}";
  EXPECT_EQ(failure(deep).first, ErrorKind::Syntax);
}

TEST(JinjaEngine, StrftimeNowUsesTheInjectedClock) {
  RenderOptions opt;
  opt.clock = fixed_time;
  EXPECT_EQ(render("{{ strftime_now('%d %B %Y') }}", vars(), opt), "15 January 2026");
  // Without one it is the local time now.
  char year[8];
  const std::time_t now = std::time(nullptr);
  std::tm t{};
  localtime_r(&now, &t);
  std::strftime(year, sizeof year, "%Y", &t);
  EXPECT_EQ(Template("{{ strftime_now('%Y') }}").render(ordered_json::object()), year);
}

TEST(JinjaEngine, KeyOrderOfTheInputIsKept) {
  const ordered_json v = ordered_json::parse(R"({"tool": {"z": 1, "a": {"y": true, "b": null}}})");
  EXPECT_EQ(render("{{ tool|tojson }}|{{ tool }}|{% for k in tool %}{{ k }}{% endfor %}", v),
            "{\"z\": 1, \"a\": {\"y\": true, \"b\": null}}|{'z': 1, 'a': {'y': True, 'b': None}}|za");
}

TEST(JinjaEngine, OneTemplateRendersOnManyThreads) {
  const Template t(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ m.content }}{% endfor %}={{ ns.n }}");
  std::vector<std::thread> threads;
  std::vector<std::string> got(8);
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      ordered_json v = {{"messages", ordered_json::array()}};
      for (int k = 0; k <= i; ++k) v["messages"].push_back({{"content", std::to_string(k)}});
      for (int rep = 0; rep < 200; ++rep) got[size_t(i)] = t.render(v);
    });
  for (auto& th : threads) th.join();
  for (int i = 0; i < 8; ++i) {
    std::string want;
    for (int k = 0; k <= i; ++k) want += std::to_string(k);
    EXPECT_EQ(got[size_t(i)], want + "=" + std::to_string(i + 1));
  }
}

TEST(JinjaEngine, LongOperatorChainsAreBounded) {
  // A left-deep chain is a deep tree: bounded like nesting, so neither the
  // parser, the evaluator nor the tree's destructor can run out of stack.
  std::string sum = "{{ 1";
  for (int i = 0; i < 100; ++i) sum += " + 1";
  EXPECT_EQ(render(sum + " }}"), "101");
  std::string longer = "{{ 1";
  for (int i = 0; i < 100000; ++i) longer += " + 1";
  EXPECT_EQ(failure(longer + " }}").first, ErrorKind::Syntax);
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 100000; ++i) filters += "|trim";
  EXPECT_EQ(failure(filters + " }}").first, ErrorKind::Syntax);
}
