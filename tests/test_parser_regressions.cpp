// Inputs that once crashed, hung or hit undefined behaviour in the readers and writers (found by the libFuzzer
// targets in tests/fuzz, minimised by hand), and the stated limits: each must now give InvalidArgument naming the
// source, or a model that every writer can write. Also: oversize input, XML nested too deep, external and
// recursive entities (refused, never read, never expanded).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "hopwise/common/error.h"
#include "hopwise/compression/spec.h"
#include "hopwise/topology/formats.h"
#include "hopwise/topology/graph.h"

namespace fs = std::filesystem;
using namespace hopwise::topology;

namespace {

// The message of the InvalidArgument that parsing `text` throws ("" and a test failure when it does not throw).
std::string refusal(const std::string& text, const std::string& source = "bad.txt") {
  try {
    (void)parse_topology(text, source);
  } catch (const hopwise::InvalidArgument& e) {
    const std::string w = e.what();
    EXPECT_EQ(w.rfind(source + ":", 0), 0u) << "message does not start with the source: " << w;
    return w;
  }
  ADD_FAILURE() << "accepted:\n" << text.substr(0, 300);
  return "";
}

// What the fuzz targets do with an accepted model: every writer runs and the JSON reads back to the same JSON.
void writes_everywhere(const Topology& t) {
  const std::string j = to_json(t);
  EXPECT_EQ(to_json(parse_json(j, "roundtrip.json")), j);
  EXPECT_FALSE(to_dot(t).empty());
  EXPECT_FALSE(to_nccl_xml(t).empty());
}

// A file under the system temp directory, removed at the end of the test.
struct TempFile {
  fs::path path;
  explicit TempFile(const std::string& name, const std::string& content = "")
      : path(fs::temp_directory_path() / ("hopwise-regress-" + std::to_string(::getpid()) + "-" + name)) {
    std::ofstream(path, std::ios::binary) << content;
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

}  // namespace

// ------------------------------------------------------------------ found by fuzzing

// Names are kept byte for byte and need not be UTF-8; to_json threw nlohmann's type_error (terminate) on them.
TEST(ParserRegressions, InvalidUtf8NamesStillWriteJson) {
  const Topology nccl = parse_topology("<system version=\"1\" name=\"host\xBE\">\n</system>\n", "utf8.xml");
  writes_everywhere(nccl);
  EXPECT_NE(to_json(nccl).find("host\xEF\xBF\xBD"), std::string::npos);  // written as U+FFFD
  const Topology smi = parse_topology(
      "        GPU0    NIC0\nGPU0     X      PIX\nNIC0    PIX      X\n\nNIC Legend:\n\n  NIC0: mlx5_\xCA\n",
      "utf8.txt");
  writes_everywhere(smi);
  const Topology raw = parse_topology("<system version=\"1\" name=\"\xFF\xFE\">\n</system>\n", "ff.xml");
  writes_everywhere(raw);
}

// An integer field beyond int ("count": 19223372036854775807) was cast by nlohmann's get<int>() (undefined).
TEST(ParserRegressions, JsonIntegersOutOfRangeAreRefused) {
  const std::string good = to_json(parse_topology("        GPU0    GPU1\nGPU0     X      NV2\nGPU1    NV2      X\n"));
  ASSERT_NE(good.find("\"count\": 2"), std::string::npos) << good;
  for (const char* bad : {"19223372036854775807", "2147483648", "-2147483649", "2.5", "1e300"}) {
    std::string text = good;
    text.replace(text.find("\"count\": 2"), 10, std::string("\"count\": ") + bad);
    const std::string w = refusal(text, "count.json");
    EXPECT_NE(w.find("expected an integer"), std::string::npos) << bad << ": " << w;
  }
  std::string at_limit = good;
  at_limit.replace(at_limit.find("\"count\": 2"), 10, "\"count\": 2147483647");
  writes_everywhere(parse_topology(at_limit, "max.json"));
}

// A number beyond double ("15.75e308155") made nlohmann throw out_of_range from parse, which escaped.
TEST(ParserRegressions, JsonNumberOverflowIsRefusedWithItsLine) {
  const std::string w = refusal("{\n\"schema\": \"hopwise-topology\",\n\"version\": 15.75384611e308155\n}", "big.json");
  EXPECT_NE(w.find("big.json:3:"), std::string::npos) << w;
  EXPECT_NE(w.find("invalid JSON"), std::string::npos) << w;
}

// <c2c count="1e300">: the count went through a double-to-int cast (undefined); a huge bw overflowed the writer's
// long long cast.
TEST(ParserRegressions, NcclC2cCountAndBandwidth) {
  auto c2c = [](const std::string& attrs) {
    return "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"0000:01:00.0\" class=\"0x030200\">\n"
           "      <gpu dev=\"0\" sm=\"90\">\n        <c2c " +
           attrs + "/>\n      </gpu>\n    </pci>\n  </cpu>\n</system>\n";
  };
  EXPECT_NE(refusal(c2c("bw=\"40000\" count=\"1e300\""), "c2c.xml").find("c2c.xml:5:"), std::string::npos);
  EXPECT_NE(refusal(c2c("bw=\"40000\" count=\"4096\""), "c2c.xml").find("out of range"), std::string::npos);
  EXPECT_NE(refusal(c2c("bw=\"1e308\" count=\"1000\""), "c2c.xml").find("overflows"), std::string::npos);
  const Topology t = parse_topology(c2c("bw=\"1e300\" count=\"10\""), "c2c.xml");
  writes_everywhere(t);
  const Topology ok = parse_topology(c2c("bw=\"40000\" count=\"10\""), "c2c.xml");
  EXPECT_NE(to_nccl_xml(ok).find("<c2c bw=\"40000\" count=\"10\"/>"), std::string::npos) << to_nccl_xml(ok);
}

// NVLink counts to an NVSwitch are summed per GPU: count="2000000000" twice overflowed int.
TEST(ParserRegressions, NcclNvlinkCountsAreBounded) {
  auto nvs = [](const std::string& count) {
    return "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"0000:01:00.0\" class=\"0x030200\">\n"
           "      <gpu dev=\"0\" sm=\"90\">\n"
           "        <nvlink target=\"0000:aa:00.0\" count=\"" +
           count + "\" tclass=\"0x068000\"/>\n        <nvlink target=\"0000:ab:00.0\" count=\"" + count +
           "\" tclass=\"0x068000\"/>\n      </gpu>\n    </pci>\n  </cpu>\n</system>\n";
  };
  EXPECT_NE(refusal(nvs("2000000000"), "nvs.xml").find("nvs.xml:5:"), std::string::npos);
  EXPECT_NE(refusal(nvs("-1"), "nvs.xml").find("out of range"), std::string::npos);
  const Topology t = parse_topology(nvs("1024"), "nvs.xml");
  writes_everywhere(t);
  bool found = false;
  for (const auto& l : t.links())
    if (l.kind == LinkKind::NVLink) found = l.count == 2048;
  EXPECT_TRUE(found);
}

// A NIC of speed LLONG_MAX and dev INT_MAX with two ports: the NCCL writer cast speed*1000 to long long and computed
// dev + port in int (both undefined).
TEST(ParserRegressions, NcclHugeNicSpeedAndIndexWrite) {
  const Topology t = parse_topology(
      "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <nic>\n"
      "      <net name=\"a\" dev=\"2147483647\" speed=\"9223372036854775807\"/>\n"
      "      <net name=\"b\" dev=\"0\" speed=\"9223372036854775807\"/>\n    </nic>\n  </cpu>\n</system>\n",
      "nic.xml");
  writes_everywhere(t);
  EXPECT_NE(to_nccl_xml(t).find("dev=\"2147483648\""), std::string::npos) << to_nccl_xml(t);
}

// The JSON reader accepts any finite double; the writers must not cast them unchecked.
TEST(ParserRegressions, JsonHugeFiguresWrite) {
  std::string j = to_json(parse_topology(
      "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"0000:01:00.0\" class=\"0x030200\">\n"
      "      <gpu dev=\"0\" sm=\"90\">\n        <c2c bw=\"40000\" count=\"1\"/>\n      </gpu>\n    </pci>\n"
      "    <nic>\n      <net name=\"a\" dev=\"0\" speed=\"100000\"/>\n    </nic>\n  </cpu>\n</system>\n",
      "c2c.xml"));
  for (const std::string key : {"\"bandwidth_gbps\": 40.0", "\"speed_gbps\": 100.0"}) {
    ASSERT_NE(j.find(key), std::string::npos) << key << "\n" << j;
    j.replace(j.find(key), key.size(), key.substr(0, key.find(':') + 2) + "1.5e308");
  }
  writes_everywhere(parse_json(j, "huge.json"));
}

// An NVLinkBandwidth matrix value of 1e999 became an infinite bandwidth, which JSON can not carry.
TEST(ParserRegressions, HwlocDistancesMustBeFinite) {
  auto doc = [](const std::string& v) {
    return "<topology version=\"2.0\">\n  <object type=\"Machine\" os_index=\"0\">\n"
           "    <object type=\"PCIDev\" gp_index=\"5\" pci_busid=\"0000:01:00.0\" pci_type=\"0302 [10de:20b0]\"/>\n"
           "    <object type=\"PCIDev\" gp_index=\"6\" pci_busid=\"0000:02:00.0\" pci_type=\"0302 [10de:20b0]\"/>\n"
           "  </object>\n  <distances2 type=\"PCIDev\" nbobjs=\"2\" kind=\"5\" name=\"NVLinkBandwidth\">\n"
           "    <indexes length=\"2\">5 6</indexes>\n    <u64values length=\"4\">0 " +
           v + " " + v + " 0</u64values>\n  </distances2>\n</topology>\n";
  };
  for (const char* v : {"1e999", "nan", "inf"})
    EXPECT_NE(refusal(doc(v), "dist.xml").find("finite"), std::string::npos) << v;
  const Topology t = parse_topology(doc("150000"), "dist.xml");
  writes_everywhere(t);
  EXPECT_EQ(t.path(*t.find_by_name("GPU0"), *t.find_by_name("GPU1")).bottleneck_gbps, 150.0);
}

// 20000 empty <cpu/> elements (120 KB) asked the full inter-socket mesh for 200 million links (out of memory).
TEST(ParserRegressions, SocketMeshIsBounded) {
  std::string nccl = "<system version=\"1\">\n";
  for (int i = 0; i < 20000; ++i) nccl += "<cpu/>";
  nccl += "\n</system>\n";
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(refusal(nccl, "cpus.xml").find("over the limit of 1024"), std::string::npos);
  std::string hwloc = "<topology version=\"2.0\">\n<object type=\"Machine\">\n";
  for (int i = 0; i < 5000; ++i) hwloc += "<object type=\"Package\"/>";
  hwloc += "\n</object>\n</topology>\n";
  EXPECT_NE(refusal(hwloc, "pkgs.xml").find("over the limit of 1024"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  std::string few = "<system version=\"1\">\n";
  for (int i = 0; i < 64; ++i) few += "<cpu numaid=\"" + std::to_string(i) + "\"/>";
  few += "\n</system>\n";
  EXPECT_EQ(parse_topology(few, "few.xml").links().size(), 64u + 64u * 63u / 2u);
}

// NCCL graph files added their GPUs and NICs without the kMaxNodes check.
TEST(ParserRegressions, NcclGraphFileHonoursNodeLimit) {
  std::string g = "<graphs version=\"1\">\n<graph>\n<channel>\n";
  for (int i = 0; i <= kMaxNodes; ++i) g += "<gpu dev=\"" + std::to_string(i) + "\"/>";
  g += "\n</channel>\n</graph>\n</graphs>\n";
  EXPECT_NE(refusal(g, "graph.xml").find("more than " + std::to_string(kMaxNodes)), std::string::npos);
}

// NV followed by 11 digits went through atoi (overflow); NV# takes at most 4 digits.
TEST(ParserRegressions, NvidiaSmiNvCountIsBounded) {
  EXPECT_NE(refusal("        GPU0    GPU1\nGPU0     X      NV99999999999\nGPU1    NV99999999999      X\n", "nv.txt")
                .find("unknown cell 'NV99999999999'"),
            std::string::npos);
  writes_everywhere(parse_topology("        GPU0    GPU1\nGPU0     X      NV18\nGPU1    NV18      X\n", "nv.txt"));
}

// ------------------------------------------------------------------ stated limits

TEST(ParserLimits, OversizeInputIsRefusedWithTheLimit) {
  const std::string limit = std::to_string(kMaxFileBytes);
  std::string huge(kMaxFileBytes + 1, ' ');
  huge.replace(0, 20, "<system version=\"1\">");
  const std::string w = refusal(huge, "huge.xml");
  EXPECT_NE(w.find("huge.xml:1:"), std::string::npos) << w;
  EXPECT_NE(w.find("limit of " + limit + " bytes"), std::string::npos) << w;
  huge.clear();
  huge.shrink_to_fit();
  // load_topology checks the size before reading: a sparse file costs no disk.
  TempFile f("huge.xml");
  fs::resize_file(f.path, kMaxFileBytes + 1);
  try {
    (void)load_topology(f.path.string());
    ADD_FAILURE() << "accepted a file over the limit";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("limit of " + limit + " bytes"), std::string::npos) << e.what();
  }
}

TEST(ParserLimits, DeepXmlIsRefusedWithTheLimit) {
  const std::string limit = "limit of " + std::to_string(kMaxXmlDepth) + " levels";
  std::string nccl = "<system version=\"1\">\n";
  for (int i = 0; i < kMaxXmlDepth; ++i) nccl += "<pci busid=\"0000:00:00.0\">\n";
  EXPECT_NE(refusal(nccl, "deep.xml").find("deep.xml:" + std::to_string(kMaxXmlDepth + 1) + ": "), std::string::npos);
  EXPECT_NE(refusal(nccl, "deep.xml").find(limit), std::string::npos);
  std::string hwloc = "<topology version=\"2.0\">";
  for (int i = 0; i < 100000; ++i) hwloc += "<object type=\"Group\">";  // far deeper: refused at once, no recursion
  EXPECT_NE(refusal(hwloc, "deep-hwloc.xml").find(limit), std::string::npos);
  std::string json = "{\"schema\": \"hopwise-topology\", \"x\": ";
  for (int i = 0; i < 100000; ++i) json += "[";
  EXPECT_NE(refusal(json, "deep.json").find(limit), std::string::npos);
  // Exactly at the limit still reads.
  std::string ok = "<system version=\"1\">\n";
  for (int i = 1; i < kMaxXmlDepth; ++i) ok += "<pci busid=\"0000:00:" + std::to_string(i) + ".0\">\n";
  for (int i = 1; i < kMaxXmlDepth; ++i) ok += "</pci>\n";
  ok += "</system>\n";
  EXPECT_NO_THROW((void)parse_topology(ok, "ok.xml"));
}

// ------------------------------------------------------------------ entities

// An external DTD or entity is never fetched: the file it names holds a definition of &xxe; that would make the
// document valid if it were read.
TEST(ParserEntities, ExternalEntitiesAreNeverRead) {
  TempFile dtd("xxe.dtd", "<!ENTITY xxe \"SECRET-FROM-FILE\">\n");
  const std::string url = "file://" + dtd.path.string();
  // External DTD subset: accepted as a declaration, not read, so &xxe; stays unknown.
  std::string w = refusal("<?xml version=\"1.0\"?>\n<!DOCTYPE system SYSTEM \"" + url +
                              "\">\n<system version=\"1\" name=\"&xxe;\">\n</system>\n",
                          "ext-dtd.xml");
  EXPECT_NE(w.find("unknown entity '&xxe;'"), std::string::npos) << w;
  EXPECT_EQ(w.find("SECRET"), std::string::npos) << w;
  // The classic XXE: an external entity declared in an internal subset (here naming /etc/passwd and the file).
  for (const std::string& target : {std::string("file:///etc/passwd"), url}) {
    w = refusal("<?xml version=\"1.0\"?>\n<!DOCTYPE system [\n<!ENTITY xxe SYSTEM \"" + target +
                    "\">\n]>\n<system version=\"1\" name=\"&xxe;\">\n</system>\n",
                "xxe.xml");
    EXPECT_NE(w.find("DOCTYPE internal subsets"), std::string::npos) << w;
    EXPECT_EQ(w.find("SECRET"), std::string::npos) << w;
    EXPECT_EQ(w.find("root:"), std::string::npos) << w;
  }
  // Without a DTD the entity is simply unknown; a DOCTYPE naming /etc/passwd is harmless and the document reads.
  EXPECT_NE(refusal("<system version=\"1\" name=\"&xxe;\">\n</system>\n", "bare.xml").find("unknown entity"),
            std::string::npos);
  const Topology t = parse_topology(
      "<!DOCTYPE topology SYSTEM \"file:///etc/passwd\">\n<topology version=\"2.0\">\n"
      "  <object type=\"Machine\" os_index=\"0\"/>\n</topology>\n",
      "doctype-system.xml");
  EXPECT_EQ(t.count(NodeKind::Host), 1);
}

// Billion laughs: nested internal entities are refused before any expansion, in well under a second.
TEST(ParserEntities, BillionLaughsIsRefusedUnexpanded) {
  std::string doc = "<?xml version=\"1.0\"?>\n<!DOCTYPE lolz [\n <!ENTITY lol \"lol\">\n";
  for (int i = 1; i <= 9; ++i) {
    doc += " <!ENTITY lol" + std::to_string(i) + " \"";
    for (int k = 0; k < 10; ++k) doc += i == 1 ? "&lol;" : "&lol" + std::to_string(i - 1) + ";";
    doc += "\">\n";
  }
  doc += "]>\n<topology version=\"2.0\"><object type=\"Machine\" name=\"&lol9;\"/></topology>\n";
  const auto t0 = std::chrono::steady_clock::now();
  const std::string w = refusal(doc, "lol.xml");
  EXPECT_NE(w.find("lol.xml:2:"), std::string::npos) << w;
  EXPECT_NE(w.find("DOCTYPE internal subsets"), std::string::npos) << w;
  EXPECT_EQ(w.find("lollol"), std::string::npos) << w;
  // The references alone, without their declarations, are unknown entities.
  EXPECT_NE(refusal("<system version=\"1\" name=\"&lol9;&lol9;\">\n</system>\n", "refs.xml").find("unknown entity"),
            std::string::npos);
  // Refused before any expansion: milliseconds here. The bound is only a hang guard (the expansion would build 10^9
  // strings), loose enough for a loaded machine or a sanitizer build.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

// ------------------------------------------------------------------ codec spec strings

// Edge cases the spec fuzzer ran through: each is refused with InvalidArgument or parses to a spec whose canonical
// form parses back to itself.
TEST(ParserRegressions, CodecSpecEdgeCases) {
  using hopwise::compression::parse_codec_spec;
  for (const char* bad : {"", ":", " : ", ":ef=1", "topk:,", "topk:ef", "topk:=1", "topk:ef=", "topk:ef=1,",
                          "topk:ef=1,ef=0", "topk:ef=1,,ratio=0.1", "\t"})
    EXPECT_THROW((void)parse_codec_spec(bad), hopwise::InvalidArgument) << "'" << bad << "'";
  for (const char* ok :
       {"none", "topk:", " int8 : block = 256 ", "topk:ratio=0.01,ef=1", "a=b", "x:k=v=w", "n:k:x=1"}) {
    const auto spec = parse_codec_spec(ok);
    const auto again = parse_codec_spec(spec.to_string());
    EXPECT_EQ(again.name, spec.name) << ok;
    EXPECT_EQ(again.params, spec.params) << ok;
  }
}
