/*
  mysql_co_server_check.h: is the running mariadbd the build mysql_co.so was compiled for?

  mysql_co reads private server structures (THD, handlerton) at offsets that are right for
  one exact build only (the layout check in mysql_co.cc proves them at build time against
  the installed binary). After a server upgrade (a Debian security update, another 10.11.x)
  the same .so would read them at wrong offsets. So each of its plugins' init functions asks
  this check first and refuses to load when the server differs, with a message naming both
  builds and the rebuild command.

  The identity of a build: the GNU build-id ELF note of mariadbd (a hash the linker writes,
  different for every build) and the server's version string. At build time
  scripts/build-mysql-co.sh reads both from the installed mariadbd (readelf -n, --version)
  into mysql_co_layout.h; at load time the build-id comes from the running executable's
  program headers in memory (dl_iterate_phdr: no file read, and right even when apt
  replaced /usr/sbin/mariadbd under a server still running the old binary).

  Plain C++ and libc only (no server headers): mysql_co_rules_test.cc tests it with g++.
*/
#pragma once

#include <elf.h>
#include <link.h>

#include <cstring>
#include <string>

namespace co_server_check {

/* Build-id of a GNU note segment as lowercase hex, or "" when it has none. Note entries
   are padded to 4 bytes (8 when the segment is 8-aligned, as .note.gnu.property is). */
inline std::string build_id_in_notes(const unsigned char *p, size_t size, size_t align)
{
  static const char hex[]= "0123456789abcdef";
  if (align != 8)
    align= 4;
  auto pad= [align](size_t n) { return (n + align - 1) & ~(align - 1); };
  size_t off= 0;
  while (off + sizeof(ElfW(Nhdr)) <= size)
  {
    ElfW(Nhdr) h;
    std::memcpy(&h, p + off, sizeof h);
    size_t name_at= off + sizeof h;
    size_t desc_at= name_at + pad(h.n_namesz);
    size_t next= desc_at + pad(h.n_descsz);
    if (desc_at > size || desc_at + h.n_descsz > size || next <= off)
      return "";                                   // malformed: never read past the segment
    if (h.n_type == NT_GNU_BUILD_ID && h.n_namesz == 4 &&
        std::memcmp(p + name_at, "GNU", 4) == 0)
    {
      std::string s;
      for (size_t i= 0; i < h.n_descsz; i++)
      {
        s+= hex[p[desc_at + i] >> 4];
        s+= hex[p[desc_at + i] & 15];
      }
      return s;
    }
    off= next;
  }
  return "";
}

/* Build-id of the running executable (the first object dl_iterate_phdr reports is the
   main program), or "" when it has none. */
inline std::string running_build_id()
{
  std::string id;
  dl_iterate_phdr([](struct dl_phdr_info *info, size_t, void *data) -> int {
    std::string *out= static_cast<std::string *>(data);
    for (int i= 0; i < info->dlpi_phnum && out->empty(); i++)
    {
      const ElfW(Phdr) &ph= info->dlpi_phdr[i];
      if (ph.p_type == PT_NOTE)
        *out= build_id_in_notes(
            reinterpret_cast<const unsigned char *>(info->dlpi_addr + ph.p_vaddr),
            ph.p_memsz, ph.p_align);
    }
    return 1;                                      // stop after the main program
  }, &id);
  return id;
}

/* The running server's version string may carry suffixes the server adds at start
   ("-log" with the binary log, "-debug"): it matches when it is the expected string,
   or that string followed by '-'. */
inline bool version_matches(const char *expected, const char *running)
{
  size_t n= std::strlen(expected);
  return std::strncmp(expected, running, n) == 0 && (running[n] == '\0' || running[n] == '-');
}

/* "" when the running server is the build mysql_co was compiled for, else the refusal
   text for the server log. An empty expected build-id (the installed mariadbd had no
   build-id note when the plugin was built) checks the version alone. */
inline std::string mismatch(const char *want_id, const char *want_version,
                            const std::string &got_id, const char *got_version,
                            const char *rebuild)
{
  bool id_ok= *want_id == '\0' || got_id == want_id;
  if (id_ok && version_matches(want_version, got_version))
    return "";
  return std::string("mysql_co: refusing to load: this mysql_co.so was built for MariaDB ") +
         want_version + " (mariadbd build-id " + (*want_id ? want_id : "none") +
         "), but the running server is MariaDB " + got_version + " (build-id " +
         (got_id.empty() ? "none" : got_id) + "). mysql_co reads private server structures "
         "whose layout differs between builds, so loading it here could crash the server. "
         "Rebuild it against the installed server: " + rebuild +
         " (docs/mysql_co.md, \"Upgrading MariaDB: rebuild mysql_co\").";
}

}  // namespace co_server_check
