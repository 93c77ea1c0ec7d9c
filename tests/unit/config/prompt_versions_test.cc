// A step's other prompt versions (`prompts:`), loaded beside the default
// for replays (issue 11).
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/config/config.h"

namespace idem {
namespace {

namespace fs = std::filesystem;

class PromptDir {
 public:
  PromptDir() {
    static std::atomic<int> counter{0};
    root_ = fs::temp_directory_path() / ("idem_prompt_versions_test_" + std::to_string(::getpid()) +
                                         "_" + std::to_string(counter++));
    fs::remove_all(root_);
    Write("conf/prompts/p.mustache", "Ticket: {{{input.text}}}\n");
    Write("conf/prompts/p2.mustache", "Version two. Ticket: {{{input.text}}}\n");
    Write("conf/prompts/broken.mustache", "Ticket: {{#input.text}}\n");
    Write("conf/rules.yaml", "rules: []\n");
    Write("schemas/out.json", R"({"type": "object"})");
  }
  ~PromptDir() { fs::remove_all(root_); }
  void Write(const std::string& relative, const std::string& text) {
    fs::path p = root_ / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string Path(const std::string& relative) const { return (root_ / relative).string(); }
  StatusOr<Config> Load(const std::string& prompts_yaml) {
    Write("conf/idem.yaml", R"(providers:
  demo:
    type: scripted
    rules: rules.yaml
steps:
  triage:
    provider: demo
    model: m-1
    system: be brief
    prompt: {template: prompts/p.mustache, version: v1}
    output_schema: ../schemas/out.json
)" + prompts_yaml);
    return LoadConfig(Path("conf/idem.yaml"));
  }

 private:
  fs::path root_;
};

}  // namespace

TEST_CASE("other_prompt_versions_load_beside_the_default_which_stays_the_prompt") {
  PromptDir dir;
  auto config = dir.Load("    prompts:\n      v2: {template: prompts/p2.mustache}\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  const StepConfig& step = config->steps.at("triage");
  CHECK(step.prompt.version == "v1");
  CHECK(step.prompt.text == "Ticket: {{{input.text}}}\n");
  REQUIRE(step.other_prompts.size() == 1);
  const PromptConfig& v2 = step.other_prompts.at("v2");
  CHECK(v2.version == "v2");
  CHECK(v2.template_path == dir.Path("conf/prompts/p2.mustache"));
  CHECK(v2.text == "Version two. Ticket: {{{input.text}}}\n");
  CHECK(v2.sha256.size() == 64);
  CHECK(v2.hash.size() == 64);
  CHECK(v2.hash != step.prompt.hash);
}

TEST_CASE("a step without prompts has no other versions") {
  PromptDir dir;
  auto config = dir.Load("");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->steps.at("triage").other_prompts.empty());
}

TEST_CASE("another_prompt_version_named_like_the_default_is_refused_at_its_key") {
  PromptDir dir;
  auto config = dir.Load("    prompts:\n      v1: {template: prompts/p2.mustache}\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/steps/triage/prompts/v1");
  CHECK(config.status().message().find("default prompt version") != std::string::npos);
}

TEST_CASE("another_prompt_version_with_a_missing_or_invalid_template_is_refused") {
  PromptDir dir;
  auto missing = dir.Load("    prompts:\n      v2: {template: prompts/nope.mustache}\n");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().field() == "/steps/triage/prompts/v2/template");
  auto broken = dir.Load("    prompts:\n      v2: {template: prompts/broken.mustache}\n");
  REQUIRE_FALSE(broken.ok());
  CHECK(broken.status().field() == "/steps/triage/prompts/v2/template");
  CHECK(broken.status().message().find("mustache") != std::string::npos);
  auto bad_name = dir.Load("    prompts:\n      \"v 2\": {template: prompts/p2.mustache}\n");
  REQUIRE_FALSE(bad_name.ok());
  auto unknown_key =
      dir.Load("    prompts:\n      v2: {template: prompts/p2.mustache, colour: red}\n");
  REQUIRE_FALSE(unknown_key.ok());
  CHECK(unknown_key.status().field() == "/steps/triage/prompts/v2/colour");
}

}  // namespace idem
