// The objects a render makes that run template code: macros (and the
// caller of a call block) and the `loop` variable of a for loop.
#pragma once
#include <deque>
#include <optional>
#include <string>

#include "jinja/interp.h"

namespace kvs::jinja {

class MacroObj : public Object {
 public:
  MacroObj(Interp* in, const MacroDef* def, ScopePtr closure) : in_(in), def_(def), closure_(std::move(closure)) {}
  std::string type_name() const override { return "Macro"; }
  bool callable() const override { return true; }
  Value call(Ctx&, Args args) override;
  std::optional<Value> attr(const std::string& name) const override;
  std::string repr() const override { return "<Macro '" + def_->name + "'>"; }
  void drop_refs() override { closure_.reset(); }

 private:
  Interp* in_;
  const MacroDef* def_;
  ScopePtr closure_;
};

// Jinja2's LoopContext: index, first/last, length, previtem/nextitem,
// cycle, changed; calling it runs a recursive loop one level deeper.
// Items are pulled one at a time (a filtered loop tests each item when it
// is reached), with look-ahead only for what needs it (last, length, ...).
class LoopObj : public Object {
 public:
  LoopObj(Interp* in, Iter fetch, const ForStmt* f, ScopePtr scope, int depth)
      : in_(in), fetch_(std::move(fetch)), for_(f), scope_(std::move(scope)), depth_(depth) {}
  std::string type_name() const override { return "LoopContext"; }
  bool callable() const override { return true; }
  Value call(Ctx& ctx, Args args) override;
  std::optional<Value> attr(const std::string& name) const override;
  std::string repr() const override;
  void drop_refs() override;
  // The next item, or nullopt at the end.
  std::optional<Value> advance();

 private:
  bool peek() const;  // an item after the current one exists
  int64_t length() const;

  Interp* in_;
  mutable Iter fetch_;
  mutable std::deque<Value> ahead_;
  const ForStmt* for_;
  ScopePtr scope_;
  int depth_;
  int64_t index0_ = -1;
  Value prev_, current_;
  std::shared_ptr<std::optional<List>> last_changed_ = std::make_shared<std::optional<List>>();
};

}  // namespace kvs::jinja
