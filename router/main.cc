// pdrouter main: placeholder until the HTTP server lands (being written now).
int main() { return 0; }
