#!/usr/bin/env python3
"""Renders chat templates with the reference Jinja2, set up as Hugging Face
transformers sets it up for apply_chat_template, for test_jinja_oracle.

Reads one JSON request on stdin:
  {"templates": [{"name", "path"}], "cases": [{"name", "vars"}], "now": [Y, M, D, h, m, s]}
and writes one JSON answer on stdout:
  {"jinja2": version, "results": {template: {case: {"ok": true, "text"} | {"ok": false, "error"}}}}
Every template is rendered with every case in this one process.
"""
import datetime
import json
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox


def make_env(now):
    # transformers.utils.chat_template_utils._compile_jinja_template, less its
    # AssistantTracker extension ({% generation %}, which no template here uses).
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return now.strftime(format)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    req = json.load(sys.stdin)
    env = make_env(datetime.datetime(*req["now"]))
    results = {}
    for t in req["templates"]:
        with open(t["path"], encoding="utf-8") as f:
            source = f.read()
        per_case = {}
        try:
            template = env.from_string(source)
        except Exception as e:  # a syntax error: every case fails the same way
            template, compile_error = None, f"{type(e).__name__}: {e}"
        for c in req["cases"]:
            if template is None:
                per_case[c["name"]] = {"ok": False, "error": compile_error}
                continue
            try:
                per_case[c["name"]] = {"ok": True, "text": template.render(**c["vars"])}
            except Exception as e:
                per_case[c["name"]] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        results[t["name"]] = per_case
    json.dump({"jinja2": jinja2.__version__, "results": results}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
