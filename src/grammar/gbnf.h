// GBNF, llama.cpp's grammar text (what llama-server's "grammar" field
// takes), to a Grammar:
//
//   root   ::= answer ws
//   answer ::= "yes" | "no" | [0-9]+ ("." [0-9]{1,3})?
//   ws     ::= [ \t\n]*          # a comment
//
// Literals "..." and classes [...] / [^...] with \n \r \t \\ \" \[ \] \-
// \xHH \uHHHH \UHHHHHHHH escapes, `.` for any character, ( ) groups,
// | alternatives, * + ? {m} {m,} {m,n} repetition. A rule's body runs
// until the next `name ::=`, so alternatives may span lines.
#pragma once
#include <string_view>

#include "grammar/grammar.h"

namespace kvs::grammar {

// Throws GrammarError naming line:column (and validate()'s errors).
Grammar parse_gbnf(std::string_view text, std::string_view root = "root");

}  // namespace kvs::grammar
