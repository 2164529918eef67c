/* Without libFuzzer (gcc builds): run the fuzz target once over every file of the directories
 * given, so `make test-c` replays the seed corpus under ASan/UBSan. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
	int files = 0;
	static uint8_t buf[1 << 20];
	for (int i = 1; i < argc; i++) {
		DIR *d = opendir(argv[i]);
		if (!d) {
			fprintf(stderr, "cannot open %s\n", argv[i]);
			return 1;
		}
		struct dirent *e;
		while ((e = readdir(d))) {
			if (e->d_name[0] == '.')
				continue;
			char path[4096];
			snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
			FILE *f = fopen(path, "rb");
			if (!f)
				continue;
			size_t n = fread(buf, 1, sizeof buf, f);
			fclose(f);
			uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan sees any overread */
			memcpy(copy, buf, n);
			LLVMFuzzerTestOneInput(copy, n);
			free(copy);
			files++;
		}
		closedir(d);
	}
	printf("%s: %d seed inputs ran\n", argv[0], files);
	return files ? 0 : 1;
}
