// ScriptedProvider: a deterministic stand-in for a model, driven by a YAML
// rules file. It powers the demo (no API key, no network) and lets tests
// script answers, malformed outputs, failures and delays.
//
// Rules file (see config/examples/demo.rules.yaml for a commented example):
//
//   rules:                       # tried in order; the first match answers
//     - name: refund             # optional, used in messages
//       match:                   # every condition must hold (empty: always)
//         step: triage_ticket    # exact step name
//         model: demo-1          # exact model name
//         repair: true           # true: repair attempts only; false: first tries only
//         input:                 # conditions on request.input; a key is a
//           text: {contains: refund, ignore_case: true}   # top-level member
//           /meta/lang: {equals: en}                      # or a JSON pointer
//           /ticket_id: {regex: "^T-[0-9]+$"}
//           /urgent: {exists: true}
//         prompt: {contains: "v2 wording"}   # on the rendered prompt text
//       output: '{"category": "refund", "id": "{{input.ticket_id}}"}'
//       # or a mapping / list: used as the JSON value, each string in it
//       #   rendered as a template (no escaping)
//       # or instead of output:
//       fail: {code: unavailable, message: "overloaded", retryable: true}
//       delay_ms: 1500           # answer after this long (Env clock)
//       times: 2                 # answer only the first 2 matching calls
//       finish_reason: length    # default "stop"
//   default:                     # when no rule matches: output / fail /
//     output: '{"category": "question"}'   # delay_ms / finish_reason
//
// An output template is mustache (kainjow) rendered with the data
//   {input, input_json (the input as JSON text), step, model, repair_feedback};
// {{x}} escapes for the inside of a JSON string, {{{x}}} inserts raw text.
// The rendered text is the response's raw_text; output is that text parsed
// as JSON, or null when it is not JSON (to script repair paths).
//
// Conditions: equals (any JSON value, compared as JSON), contains (a
// substring of a string value), regex (std::regex ECMAScript search on a
// string value; patterns at most 256 characters, and only the first 4 KiB of
// the value is searched, bounding libstdc++'s recursive matcher), exists;
// ignore_case folds ASCII case for equals / contains / regex.
//
// Failure codes: unavailable, deadline_exceeded, resource_exhausted
// (retryable unless `retryable: false`), invalid_argument, internal,
// permission_denied, unauthenticated (not retryable unless `retryable:
// true`). A delay longer than the request's timeout_ms sleeps timeout_ms and
// returns DeadlineExceeded (retryable).
//
// No match and no default: FailedPrecondition. Token counts are rough:
// bytes / 4 of system prompt + prompt, and of the output.
//
// Thread-safety: Complete may be called concurrently; rules are immutable
// after Create, and the call and `times` counters are atomic. `env` must
// outlive the provider.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/status.h"
#include "providers/provider.h"

namespace idem {

struct YamlDocument;

class ScriptedProvider final : public Provider {
 public:
  // Reads config.rules_path. InvalidArgument "FILE:LINE: /pointer: reason"
  // when the file is missing or its rules are malformed.
  static StatusOr<std::unique_ptr<ScriptedProvider>> Create(const ProviderConfig& config, Env& env);

  // Same, from YAML text; `source` names it in messages.
  static StatusOr<std::unique_ptr<ScriptedProvider>> FromYaml(std::string_view yaml,
                                                              std::string source, Env& env);

  ~ScriptedProvider() override;

  StatusOr<ProviderResponse> Complete(const ProviderRequest& request) override;
  std::string type() const override { return "scripted"; }

  // How many times Complete was called (answered or failed).
  int64_t calls() const { return calls_.load(); }

 private:
  struct Rule;
  static StatusOr<std::unique_ptr<ScriptedProvider>> Build(const YamlDocument& doc, Env& env);
  ScriptedProvider(Env& env, std::vector<std::unique_ptr<Rule>> rules,
                   std::unique_ptr<Rule> fallback);

  Env& env_;
  const std::vector<std::unique_ptr<Rule>> rules_;
  const std::unique_ptr<Rule> default_;  // may be null
  std::atomic<int64_t> calls_{0};
};

}  // namespace idem
