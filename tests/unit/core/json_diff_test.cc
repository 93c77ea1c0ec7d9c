#include "daemon/core/json_diff.h"

#include <doctest/doctest.h>

namespace idem {

using Json = nlohmann::json;

TEST_CASE("equal values have an empty diff, whatever the key order") {
  Json d = JsonDiff(Json::parse(R"({"a":1,"b":[1,2]})"), Json::parse(R"({"b":[1,2],"a":1.0})"));
  CHECK(d["added"].empty());
  CHECK(d["removed"].empty());
  CHECK(d["changed"].empty());
}

TEST_CASE("a diff names added, removed and changed pointers with both values") {
  Json from = Json::parse(R"({"a":1,"gone":true,"list":[1,2,3],"o":{"x/y":"p","k":{"deep":1}}})");
  Json to = Json::parse(R"({"a":2,"new":null,"list":[1,5],"o":{"x/y":"q","k":{"deep":1}}})");
  Json d = JsonDiff(from, to);
  CHECK(d["added"] == Json::parse(R"([{"pointer":"/new","value":null}])"));
  CHECK(d["removed"] ==
        Json::parse(R"([{"pointer":"/gone","value":true},{"pointer":"/list/2","value":3}])"));
  CHECK(d["changed"] == Json::parse(R"([{"pointer":"/a","from":1,"to":2},
      {"pointer":"/list/1","from":2,"to":5},{"pointer":"/o/x~1y","from":"p","to":"q"}])"));
}

TEST_CASE("a change of type is one change at its pointer, and the root can change") {
  Json d = JsonDiff(Json::parse(R"({"a":{"b":1}})"), Json::parse(R"({"a":[1]})"));
  CHECK(d["changed"] == Json::parse(R"([{"pointer":"/a","from":{"b":1},"to":[1]}])"));
  CHECK(JsonDiff(1, "1")["changed"][0]["pointer"] == "");
}

}  // namespace idem
