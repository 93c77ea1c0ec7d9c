// Notifier: tells humans that something waits for them (R21, R35) — a plan
// awaiting approval, an approval past its timeout, an escalation, a dead
// letter. Each message carries the id, the kind, the reason and the exact
// command or link to act on it.
//
// Delivery is at most once per (event_id, channel) across retries and
// restarts: implementations send through idem's own journal (the message
// guard), so a retry storm or a kill -9 and restart sends a message once.
//
// Thread-safety: Notify may be called concurrently from any thread; it does
// not block on the network (delivery happens on the apply workers).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace idem {

struct Notification {
  std::string event_id;    // unique per event, e.g. "plan_x:awaiting_approval"
  std::string kind;        // awaiting_approval | approval_overdue | escalation | dead_letter
  std::string subject_id;  // plan_id, escalation_id or work_id
  std::string reason;      // why a human is needed
  std::string command;     // e.g. "idem approve plan_x" (operator's CLI)
  std::string link;        // e.g. "<link_base>/ui/#/plans/plan_x"; "" without link_base
  nlohmann::json detail = nlohmann::json::object();
};

class Notifier {
 public:
  virtual ~Notifier() = default;
  virtual void Notify(const Notification& n) = 0;
};

// Sends nothing (no notifications configured).
class NullNotifier final : public Notifier {
 public:
  void Notify(const Notification&) override {}
};

}  // namespace idem
