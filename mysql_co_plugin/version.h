/* mysql_co's release version: the project's (Cargo.toml, [workspace.package]);
   regress/pytest/repository/test_versions.py checks the two agree. The hex form is what
   MariaDB's plugin descriptor takes (major << 8 | minor). */
#define MYSQL_CO_VERSION "0.3.0"
#define MYSQL_CO_VERSION_HEX 0x0003
