// Builds the page into dist/ with fixed names (usechat.js, usechat.css): the Django page
// that loads it names them with {% static %}, so no manifest is needed.
import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

export default defineConfig({
  plugins: [react()],
  build: {
    outDir: "dist",
    emptyOutDir: true,
    rollupOptions: {
      input: "src/main.tsx",
      output: {
        entryFileNames: "usechat.js",
        chunkFileNames: "[name].js",
        assetFileNames: "usechat[extname]",
      },
    },
  },
});
