package My::Suite::Mysql_co;

@ISA = qw(My::Suite);

return "mysql_co.so is not in the plugin directory (run scripts/build-mysql-co.sh)" unless $ENV{MYSQL_CO_SO};

sub is_default { 0 }

bless { };
