#!/usr/bin/perl
# tests/layers.t: the include rules of planner/LAYERS, checked over every #include "..." in
# planner/, sim/, real/ and cli/ (.c, .h, .cu); speaks TAP for prove (`make test`).
#
#   tests/layers.t [--tap] [--root DIR]   two tests: no include goes up or sideways against
#                                         planner/LAYERS; no include cycle between modules
#   tests/layers.t --report [--root DIR]  prints each layer's files and every include cycle
#
# A module is a file's directory and name without .c/.h/.cu (zp_sched.c and zp_sched.h are one
# module): real_engine.c including real_engine_ds.h while real_engine_ds.c includes
# real_engine.h is a cycle, though no file includes itself. An include names a file by its
# base name (the Makefile puts every folder on the include path); one that names no file of
# these folders (a system header in quotes) is not checked.
use strict;
use warnings;
use File::Find;

my ($report, $root) = (0, '.');
for (my $i = 0; $i < @ARGV; $i++) {
    if ($ARGV[$i] eq '--report') { $report = 1 }
    elsif ($ARGV[$i] eq '--tap') { }
    elsif ($ARGV[$i] eq '--root' && $i + 1 < @ARGV) { $root = $ARGV[++$i] }
    else { die "layers.t: unknown argument \"$ARGV[$i]\" (--tap, --report, --root DIR)\n" }
}
chdir $root or die "layers.t: cannot enter $root: $!\n";

# planner/LAYERS: "top DIR: DIRS..." (what a top-level folder may include besides itself) and
# "layer NAME" lines, bottom first (a layer may include itself and those before it).
my (%top, @layers, %rank);
my $table = 'planner/LAYERS';
if (open my $fh, '<', $table) {
    while (<$fh>) {
        s/#.*//;
        next unless /\S/;
        if (/^\s*top\s+(\w+)\s*:\s*(.*?)\s*$/) { $top{$1} = {map { $_ => 1 } split ' ', $2} }
        elsif (/^\s*layer\s+(\w+)\s*$/) { $rank{$1} = @layers; push @layers, $1 }
        else { die "layers.t: $table:$.: neither \"top DIR: DIRS\" nor \"layer NAME\"\n" }
    }
    close $fh;
} elsif (!$report) {
    die "layers.t: cannot read $table: $!\n";
}

my @files;
find({wanted => sub { push @files, $File::Find::name if /\.(c|h|cu)$/ && -f },
      no_chdir => 1}, grep { -d } qw(planner sim real cli));
@files = sort @files;
my %by_name; # base name -> path
for my $f (@files) {
    (my $base = $f) =~ s{.*/}{};
    $by_name{$base} = $f;
}

sub top_of { (split m{/}, $_[0])[0] }
# A planner file's layer: the folder under planner/ ("" for a file straight in planner/).
sub layer_of { $_[0] =~ m{^planner/([^/]+)/} ? $1 : '' }
sub module_of { (my $m = $_[0]) =~ s/\.(c|h|cu)$//; $m }

my (@bad, %edges);
for my $f (@files) {
    open my $fh, '<', $f or die "layers.t: cannot read $f: $!\n";
    while (my $line = <$fh>) {
        next unless $line =~ /^\s*#\s*include\s*"([^"]+)"/;
        my $inc = $1;
        (my $base = $inc) =~ s{.*/}{};
        my $to = $by_name{$base} or next;
        my ($mf, $mt) = (module_of($f), module_of($to));
        $edges{$mf}{$mt} = "$f:$.: #include \"$inc\"" if $mf ne $mt;
        my ($tf, $tt) = (top_of($f), top_of($to));
        if ($tf ne $tt) {
            push @bad, "$f:$.: #include \"$inc\": $tf/ may not use $tt/ (planner/LAYERS: top $tf)"
                unless $top{$tf} && $top{$tf}{$tt};
            next;
        }
        next unless $tf eq 'planner';
        my ($lf, $lt) = (layer_of($f), layer_of($to));
        if (!exists $rank{$lf} || !exists $rank{$lt}) {
            my $which = !exists $rank{$lf} ? $f : $to;
            push @bad, "$f:$.: #include \"$inc\": $which is in no layer of planner/LAYERS";
        } elsif ($rank{$lt} > $rank{$lf}) {
            push @bad, "$f:$.: #include \"$inc\": layer $lf may not use layer $lt above it";
        }
    }
    close $fh;
}

# Cycles: Tarjan's strongly connected components of the module graph; each of more than one
# module is shown as one circle through it (a path back to its first module), with the
# include behind each step.
my ($index, @stack, %on, %idx, %low, @sccs) = (0);
sub strong {
    my ($v) = @_;
    $idx{$v} = $low{$v} = $index++;
    push @stack, $v;
    $on{$v} = 1;
    for my $w (sort keys %{$edges{$v} || {}}) {
        if (!exists $idx{$w}) { strong($w); $low{$v} = $low{$w} if $low{$w} < $low{$v} }
        elsif ($on{$w} && $idx{$w} < $low{$v}) { $low{$v} = $idx{$w} }
    }
    return unless $low{$v} == $idx{$v};
    my @c;
    while (1) { my $w = pop @stack; $on{$w} = 0; push @c, $w; last if $w eq $v }
    push @sccs, [sort @c] if @c > 1;
}
my %nodes = map { module_of($_) => 1 } @files;
strong($_) for grep { !exists $idx{$_} } sort keys %nodes;

# A shortest circle from the component's first module back to it, inside the component.
sub circle {
    my ($c) = @_;
    my %in = map { $_ => 1 } @$c;
    my $start = $c->[0];
    my %prev = ($start => undef);
    my @queue = ($start);
    while (@queue) {
        my $v = shift @queue;
        for my $w (sort keys %{$edges{$v} || {}}) {
            next unless $in{$w};
            if ($w eq $start) {
                my @path = ($v);
                unshift @path, $prev{$path[0]} while defined $prev{$path[0]};
                return map { $edges{$path[$_]}{$_ < $#path ? $path[$_ + 1] : $start} } 0 .. $#path;
            }
            next if exists $prev{$w};
            $prev{$w} = $v;
            push @queue, $w;
        }
    }
    return ();
}
my @cycles = map { {modules => $_, steps => [circle($_)]} } @sccs;

if ($report) {
    for my $l (@layers, '') {
        my @in = grep { m{^planner/} && layer_of($_) eq $l } @files;
        next unless @in;
        my $name = $l eq '' ? 'planner/ (no layer)' : "layer $l";
        my $lines = 0;
        for my $f (@in) { open my $fh, '<', $f or next; $lines++ while <$fh>; close $fh }
        printf "%s (%d files, %d lines):\n  %s\n", $name, scalar @in, $lines,
               join ' ', map { s{.*/}{}r } @in;
    }
    printf "%d include cycle(s)\n", scalar @cycles;
    for my $c (@cycles) {
        printf "cycle of %d modules: %s\n", scalar @{$c->{modules}}, join ' ', @{$c->{modules}};
        print "  $_\n" for @{$c->{steps}};
    }
    print "$_\n" for @bad;
    exit 0;
}

# Diagnostics go to stderr as well as into the TAP stream, so that prove shows them.
sub diag { print "# $_[0]\n"; print STDERR "# $_[0]\n" }
$| = 1;
print "1..2\n";
print @bad ? "not ok" : "ok", " 1 - every include follows planner/LAYERS\n";
diag($_) for @bad;
print @cycles ? "not ok" : "ok", " 2 - no include cycle between modules\n";
for my $c (@cycles) {
    diag(sprintf "cycle of %d modules: %s", scalar @{$c->{modules}}, join ' ', @{$c->{modules}});
    diag("  $_") for @{$c->{steps}};
}
exit 0;
