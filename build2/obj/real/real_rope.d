build2/obj/real/real_rope.o: real/real_rope.c real/real_rope.h
real/real_rope.h:
