// The settings table (wire/config.h): one row per setting, one precedence
// (environment > rsocket's file > default), bad values fall back to the
// default and say why, the GPUSOCK_PROVIDER shorthand.
#include "wire/config.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <set>
#include <string>

namespace gpusock::config {
namespace {

// Sets variables for one test and reads the table again; restores both after.
class ScopedEnv {
 public:
  ~ScopedEnv() {
    for (const std::string &name : names_) unsetenv(name.c_str());
    reload();
  }
  void set(const char *name, const std::string &value) {
    setenv(name, value.c_str(), 1);
    names_.insert(name);
    reload();
  }

 private:
  std::set<std::string> names_;
};

// A directory of rsocket files, removed after the test.
class RsocketDir {
 public:
  RsocketDir() {
    char tmpl[] = "/tmp/gs-config-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~RsocketDir() {
    for (const std::string &f : files_) unlink((path_ + "/" + f).c_str());
    rmdir(path_.c_str());
  }
  void write(const std::string &file, const std::string &text) {
    FILE *f = std::fopen((path_ + "/" + file).c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
    files_.insert(file);
  }
  const std::string &path() const { return path_; }

 private:
  std::string path_;
  std::set<std::string> files_;
};

TEST(Config, EveryRowNamesAGpusockVariableOnceWithADoc) {
  std::set<std::string> names;
  for (int i = 0; i < static_cast<int>(Id::kCount); ++i) {
    const Setting &s = describe(static_cast<Id>(i));
    EXPECT_EQ(std::string(s.name).rfind("GPUSOCK_", 0), 0u) << s.name;
    EXPECT_TRUE(names.insert(s.name).second) << s.name << " twice";
    EXPECT_GT(std::string(s.doc).size(), 10u) << s.name;
    EXPECT_NE(std::string(s.component), "") << s.name;
    if (s.type != Type::kText && s.def >= s.lo) {
      EXPECT_LE(s.def, s.hi) << s.name;
    }
  }
}

TEST(Config, DefaultsWhenNothingIsSet) {
  ScopedEnv env;
  RsocketDir dir;  // empty: no file says anything
  env.set("GPUSOCK_RSOCKET_CONF_DIR", dir.path());
  EXPECT_EQ(get(Id::kMemDefault), describe(Id::kMemDefault).def);
  EXPECT_EQ(source(Id::kMemDefault), Source::kDefault);
  EXPECT_FALSE(is_set(Id::kMemDefault));
  EXPECT_EQ(get_or(Id::kBusyPollUs, 77), 77);  // a computed default
  EXPECT_EQ(value_text(Id::kBusyPollUs), "(computed)");
  EXPECT_EQ(text(Id::kFallback), "tcp");
}

TEST(Config, EnvironmentBeatsRsocketFileBeatsDefault) {
  ScopedEnv env;
  RsocketDir dir;
  dir.write("mem_default", "65536\n");
  dir.write("polling_time", " 250 ");
  env.set("GPUSOCK_RSOCKET_CONF_DIR", dir.path());
  EXPECT_EQ(get(Id::kMemDefault), 65536);
  EXPECT_EQ(source(Id::kMemDefault), Source::kRsocketFile);
  EXPECT_EQ(source_text(Id::kMemDefault), dir.path() + "/mem_default");
  EXPECT_EQ(get_or(Id::kBusyPollUs, 100), 250);
  env.set("GPUSOCK_MEM_DEFAULT", "32768");
  EXPECT_EQ(get(Id::kMemDefault), 32768);
  EXPECT_EQ(source(Id::kMemDefault), Source::kEnvironment);
}

TEST(Config, BadValuesFallBackToTheDefaultAndSayWhy) {
  ScopedEnv env;
  RsocketDir dir;
  dir.write("sqsize_default", "many");
  env.set("GPUSOCK_RSOCKET_CONF_DIR", dir.path());
  env.set("GPUSOCK_MEM_DEFAULT", "12");  // below its range
  env.set("GPUSOCK_ZCOPY", "perhaps");
  EXPECT_EQ(get(Id::kMemDefault), describe(Id::kMemDefault).def);
  EXPECT_EQ(source(Id::kMemDefault), Source::kInvalid);
  EXPECT_NE(source_text(Id::kMemDefault).find("GPUSOCK_MEM_DEFAULT='12' is not valid"), std::string::npos);
  EXPECT_FALSE(is_set(Id::kMemDefault));
  EXPECT_EQ(get(Id::kZcopy), 1);
  EXPECT_EQ(get(Id::kSqSize), describe(Id::kSqSize).def);
  EXPECT_NE(source_text(Id::kSqSize).find("sqsize_default='many'"), std::string::npos);
  EXPECT_EQ(get_or(Id::kMaxSpinners, 3), 3);
}

TEST(Config, BooleansLevelsAndNumbersParseTheUsualSpellings) {
  ScopedEnv env;
  env.set("GPUSOCK_ZCOPY", "off");
  EXPECT_EQ(get(Id::kZcopy), 0);
  env.set("GPUSOCK_ZCOPY", "Yes");
  EXPECT_EQ(get(Id::kZcopy), 1);
  env.set("GPUSOCK_LOG", "debug");
  EXPECT_EQ(get(Id::kLog), 2);
  EXPECT_EQ(value_text(Id::kLog), "debug");
  env.set("GPUSOCK_LOG", "1");
  EXPECT_EQ(get(Id::kLog), 1);
  env.set("GPUSOCK_RING_LARGE", "0x100000");
  EXPECT_EQ(get(Id::kRingLarge), 1 << 20);
}

TEST(Config, ProviderStandsForTransportUnlessTransportIsSet) {
  ScopedEnv env;
  unsetenv("GPUSOCK_TRANSPORT");
  env.set("GPUSOCK_PROVIDER", "shm");
  EXPECT_EQ(text(Id::kTransport), "fabric:shm");
  EXPECT_EQ(source(Id::kTransport), Source::kAlias);
  env.set("GPUSOCK_PROVIDER", "verbs");
  EXPECT_EQ(text(Id::kTransport), "verbs");
  env.set("GPUSOCK_TRANSPORT", "fabric:tcp");
  EXPECT_EQ(text(Id::kTransport), "fabric:tcp");
  EXPECT_EQ(source(Id::kTransport), Source::kEnvironment);
}

}  // namespace
}  // namespace gpusock::config
