// hopwise::compression: codec spec strings.
#include <gtest/gtest.h>

#include <string>

#include "hopwise/common/error.h"
#include "hopwise/compression/spec.h"

namespace {

using hopwise::compression::CodecSpec;
using hopwise::compression::parse_codec_spec;

TEST(CodecSpec, NameOnly) {
  for (const char* name : {"none", "fp16", "bf16"}) {
    const CodecSpec s = parse_codec_spec(name);
    EXPECT_EQ(s.name, name);
    EXPECT_TRUE(s.params.empty());
    EXPECT_EQ(s.to_string(), name);
  }
}

TEST(CodecSpec, Parameters) {
  const CodecSpec s = parse_codec_spec("int8:block=256,round=stochastic");
  EXPECT_EQ(s.name, "int8");
  ASSERT_EQ(s.params.size(), 2u);
  EXPECT_EQ(s.params.at("block"), "256");
  EXPECT_EQ(s.params.at("round"), "stochastic");
  const CodecSpec t = parse_codec_spec("topk:ratio=0.01,ef=1");
  EXPECT_EQ(t.name, "topk");
  EXPECT_EQ(t.params.at("ratio"), "0.01");
  EXPECT_EQ(t.params.at("ef"), "1");
}

TEST(CodecSpec, CanonicalFormSortsParameters) {
  EXPECT_EQ(parse_codec_spec("topk:ratio=0.01,ef=1").to_string(), "topk:ef=1,ratio=0.01");
  EXPECT_EQ(parse_codec_spec("int8:round=stochastic,block=256").to_string(), "int8:block=256,round=stochastic");
  for (const char* text : {"none", "int8:block=256,round=stochastic", "topk:ef=1,ratio=0.01", "x:a=1,b=2,c=3"}) {
    const CodecSpec s = parse_codec_spec(text);
    EXPECT_EQ(s.to_string(), text);
    const CodecSpec again = parse_codec_spec(s.to_string());
    EXPECT_EQ(again.name, s.name);
    EXPECT_EQ(again.params, s.params);
  }
}

TEST(CodecSpec, TrimsSpaces) {
  const CodecSpec s = parse_codec_spec("  int8 : block = 256 ,\tround=nearest ");
  EXPECT_EQ(s.name, "int8");
  EXPECT_EQ(s.params.at("block"), "256");
  EXPECT_EQ(s.params.at("round"), "nearest");
  EXPECT_EQ(s.to_string(), "int8:block=256,round=nearest");
}

TEST(CodecSpec, Rejects) {
  const std::pair<const char*, const char*> bad[] = {
      {"", "no codec name"},
      {"   ", "no codec name"},
      {":block=1", "no codec name"},
      {"int8:block", "block"},
      {"int8:=3", "=3"},
      {"int8:block=", "block="},
      {"int8:block=1,,round=x", "is not key=value"},
      {"int8:block=1,block=2", "given twice"},
      {"int8:block=1, block =2", "given twice"},
  };
  for (const auto& [text, needle] : bad) {
    SCOPED_TRACE(std::string("'") + text + "'");
    try {
      parse_codec_spec(text);
      ADD_FAILURE() << "no exception";
    } catch (const hopwise::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

}  // namespace
