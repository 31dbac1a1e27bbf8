// The parsed template: expression and statement nodes, each with the line
// it starts on (for error messages). Built once by the parser, then only
// read by renders (which may run on many threads at once).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"
#include "jinja/value_ops.h"

namespace kvs::jinja {

struct Expr {
  enum class Kind {
    Const,
    Name,
    List,
    Dict,
    Unary,
    Binary,
    And,
    Or,
    Concat,
    Compare,
    Cond,
    Attr,
    Item,
    Slice,
    Call,
    Filter,
    Test,
    NsRef
  };
  explicit Expr(Kind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  Kind kind;
  int line;
};
using ExprPtr = std::unique_ptr<Expr>;

struct CallArgs {
  std::vector<ExprPtr> pos;
  std::vector<std::pair<std::string, ExprPtr>> kw;
  ExprPtr star, star_star;  // *args, **kwargs
};

struct ConstExpr : Expr {
  ConstExpr(Value v, int l) : Expr(Kind::Const, l), value(std::move(v)) {}
  Value value;
};
struct NameExpr : Expr {
  NameExpr(std::string n, int l) : Expr(Kind::Name, l), name(std::move(n)) {}
  std::string name;
};
struct NsRefExpr : Expr {  // ns.attr as an assignment target
  NsRefExpr(std::string n, std::string a, int l) : Expr(Kind::NsRef, l), name(std::move(n)), attr(std::move(a)) {}
  std::string name, attr;
};
struct ListExpr : Expr {
  ListExpr(bool t, int l) : Expr(Kind::List, l), tuple(t) {}
  bool tuple;
  std::vector<ExprPtr> items;
};
struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(Kind::Dict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};
struct UnaryExpr : Expr {
  enum class Op { Neg, Pos, Not };
  UnaryExpr(Op o, ExprPtr e, int l) : Expr(Kind::Unary, l), op(o), operand(std::move(e)) {}
  Op op;
  ExprPtr operand;
};
struct BinaryExpr : Expr {  // also And / Or (kind tells)
  BinaryExpr(Kind k, BinOp o, ExprPtr a, ExprPtr b, int l)
      : Expr(k, l), op(o), left(std::move(a)), right(std::move(b)) {}
  BinOp op;
  ExprPtr left, right;
};
struct ConcatExpr : Expr {
  explicit ConcatExpr(int l) : Expr(Kind::Concat, l) {}
  std::vector<ExprPtr> parts;
};
struct CompareExpr : Expr {
  explicit CompareExpr(int l) : Expr(Kind::Compare, l) {}
  ExprPtr first;
  std::vector<std::pair<CmpOp, ExprPtr>> rest;
};
struct CondExpr : Expr {  // then if test else otherwise
  explicit CondExpr(int l) : Expr(Kind::Cond, l) {}
  ExprPtr test, then, otherwise;  // otherwise may be null
};
struct AttrExpr : Expr {
  AttrExpr(ExprPtr o, std::string a, int l) : Expr(Kind::Attr, l), obj(std::move(o)), attr(std::move(a)) {}
  ExprPtr obj;
  std::string attr;
};
struct ItemExpr : Expr {
  ItemExpr(ExprPtr o, ExprPtr k, int l) : Expr(Kind::Item, l), obj(std::move(o)), key(std::move(k)) {}
  ExprPtr obj, key;
};
struct SliceExpr : Expr {  // only as an ItemExpr's key
  explicit SliceExpr(int l) : Expr(Kind::Slice, l) {}
  ExprPtr start, stop, step;  // each may be null
};
struct CallExpr : Expr {
  explicit CallExpr(int l) : Expr(Kind::Call, l) {}
  ExprPtr fn;
  CallArgs args;
};
struct FilterExpr : Expr {  // operand null: the body of a filter block or set block
  explicit FilterExpr(int l) : Expr(Kind::Filter, l) {}
  ExprPtr operand;
  std::string name;
  CallArgs args;
};
struct TestExpr : Expr {
  explicit TestExpr(int l) : Expr(Kind::Test, l) {}
  ExprPtr operand;
  std::string name;
  CallArgs args;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    Text,
    Print,
    If,
    For,
    Set,
    SetBlock,
    Macro,
    CallBlock,
    FilterBlock,
    With,
    Break,
    Continue,
    Unsupported
  };
  Stmt(Kind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  Kind kind;
  int line;
};

struct TextStmt : Stmt {
  TextStmt(std::string t, int l) : Stmt(Kind::Text, l), text(std::move(t)) {}
  std::string text;
};
struct PrintStmt : Stmt {
  PrintStmt(ExprPtr e, int l) : Stmt(Kind::Print, l), expr(std::move(e)) {}
  ExprPtr expr;
};
struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(Kind::If, l) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, elif...
  Body otherwise;
};
struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(Kind::For, l) {}
  ExprPtr target, iter, filter;  // filter may be null
  bool recursive = false;
  Body body, otherwise;
};
struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(Kind::Set, l) {}
  ExprPtr target, value;
};
struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(int l) : Stmt(Kind::SetBlock, l) {}
  ExprPtr target, filter;  // filter may be null
  Body body;
};
struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
  int line = 0;
};
struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(Kind::Macro, l) {}
  std::unique_ptr<MacroDef> def;
};
struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(int l) : Stmt(Kind::CallBlock, l) {}
  std::unique_ptr<MacroDef> caller;
  ExprPtr call;  // a CallExpr
};
struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int l) : Stmt(Kind::FilterBlock, l) {}
  ExprPtr filter;
  Body body;
};
struct WithStmt : Stmt {
  explicit WithStmt(int l) : Stmt(Kind::With, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> assigns;
  Body body;
};
struct LoopCtlStmt : Stmt {
  LoopCtlStmt(bool brk, int l) : Stmt(brk ? Kind::Break : Kind::Continue, l) {}
};
// A statement Jinja2 parses but this engine cannot run (include, import,
// extends without a loader): rendering it is the error Jinja2 gives.
struct UnsupportedStmt : Stmt {
  UnsupportedStmt(std::string m, int l) : Stmt(Kind::Unsupported, l), message(std::move(m)) {}
  std::string message;
};

struct Program {
  Body body;
};

}  // namespace kvs::jinja
