/*
  Unit test of mysql_co_server_check.h (is the running server the build mysql_co was
  compiled for), built with g++ alone and run by scripts/test-mysql-co.sh. The load path on
  a real server (another build refused, the same build loaded) is
  regress/pytest/engine/test_mysql_co_server_check.py.
*/
#include "mysql_co_server_check.h"

#include <cstdio>
#include <string>
#include <vector>

using namespace co_server_check;

static int failures= 0;
static int checks= 0;

#define EXPECT(cond) do { checks++; if (!(cond)) { failures++; \
  std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); } } while (0)

static void put32(std::vector<unsigned char> &v, uint32_t x)
{
  for (int i= 0; i < 4; i++)
    v.push_back((unsigned char) (x >> (8 * i)));
}

/* One note: namesz, descsz, type, name padded to 4, desc padded to 4. */
static void note(std::vector<unsigned char> &v, const char *name, uint32_t namesz,
                 uint32_t type, const std::vector<unsigned char> &desc)
{
  put32(v, namesz);
  put32(v, (uint32_t) desc.size());
  put32(v, type);
  for (uint32_t i= 0; i < ((namesz + 3) & ~3u); i++)
    v.push_back(i < namesz ? (unsigned char) name[i] : 0);
  for (size_t i= 0; i < ((desc.size() + 3) & ~size_t(3)); i++)
    v.push_back(i < desc.size() ? desc[i] : 0);
}

int main()
{
  const std::vector<unsigned char> id= {0x7a, 0x14, 0xd3, 0x9c, 0x0f, 0xff, 0x00, 0x01};

  /* The build-id note after another GNU note (ABI tag, as mariadbd has). */
  std::vector<unsigned char> seg;
  note(seg, "GNU", 4, NT_GNU_ABI_TAG, {0, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0});
  note(seg, "GNU", 4, NT_GNU_BUILD_ID, id);
  EXPECT(build_id_in_notes(seg.data(), seg.size(), 4) == "7a14d39c0fff0001");

  /* A build-id type from another vendor's name is not the GNU build-id. */
  std::vector<unsigned char> other;
  note(other, "XYZ", 4, NT_GNU_BUILD_ID, id);
  EXPECT(build_id_in_notes(other.data(), other.size(), 4).empty());

  /* No note, a truncated one, a descsz past the end: "" and no read past the segment. */
  EXPECT(build_id_in_notes(seg.data(), 0, 4).empty());
  EXPECT(build_id_in_notes(seg.data(), 11, 4).empty());
  std::vector<unsigned char> bad;
  put32(bad, 4); put32(bad, 1000); put32(bad, NT_GNU_BUILD_ID);
  bad.insert(bad.end(), {'G', 'N', 'U', 0, 1, 2, 3, 4});
  EXPECT(build_id_in_notes(bad.data(), bad.size(), 4).empty());

  /* This test binary's own build-id is found when it has one (g++ on Debian links with
     --build-id); the function must at least not crash. */
  std::string self= running_build_id();
  EXPECT(self.empty() || self.size() == 40);

  /* Versions: exact, or with a suffix the server adds after '-'; nothing else. */
  EXPECT(version_matches("10.11.18-MariaDB-0+deb12u1", "10.11.18-MariaDB-0+deb12u1"));
  EXPECT(version_matches("10.11.18-MariaDB-0+deb12u1", "10.11.18-MariaDB-0+deb12u1-log"));
  EXPECT(!version_matches("10.11.18-MariaDB-0+deb12u1", "10.11.18-MariaDB-0+deb12u10"));
  EXPECT(!version_matches("10.11.18-MariaDB-0+deb12u1", "10.11.18-MariaDB-0+deb12u2"));
  EXPECT(!version_matches("10.11.18-MariaDB-0+deb12u1", "10.11.1"));

  /* The verdict and its text: both builds, and the rebuild command. */
  const char *v= "10.11.18-MariaDB-0+deb12u1";
  EXPECT(mismatch("abc", v, "abc", v, "REBUILD").empty());
  EXPECT(mismatch("", v, "abc", "10.11.18-MariaDB-0+deb12u1-log", "REBUILD").empty());
  std::string m= mismatch("abc", v, "def", v, "REBUILD");
  EXPECT(m.find("built for MariaDB 10.11.18-MariaDB-0+deb12u1 (mariadbd build-id abc)") != std::string::npos);
  EXPECT(m.find("running server is MariaDB 10.11.18-MariaDB-0+deb12u1 (build-id def)") != std::string::npos);
  EXPECT(m.find("REBUILD") != std::string::npos);
  m= mismatch("abc", v, "", "10.11.19-MariaDB-0+deb12u1", "REBUILD");
  EXPECT(m.find("running server is MariaDB 10.11.19-MariaDB-0+deb12u1 (build-id none)") != std::string::npos);

  std::printf("mysql_co_server_check_test: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
